"""What a probe costs against the run it advises, and what it measures against a verification.

    python -m benchmarks.probe_cost [--steps 60] [--repeats 3]

A `small` run (`profile-run --preset small`, fp32, the run a user starts with) is timed from launch to
its end; then `glmperf recommend RUN --json` probes its changes with a cold probe cache (a fresh
$GLMPERF_CACHE; torch.compile's own cache stays warm, as on a machine that compiled before), then again
(cached). Each probed change is then verified (`glmperf recommend RUN --verify`: fresh runs of the
run's config and the change, interleaved), and its measured gain set next to the probe's range. Last,
with the run-to-run spread that verification kept, the probes are measured again from a cold probe cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import header, mode_label, table, write_result

BIN = Path(sys.executable).parent
"""Where the installed `profile-run` and `glmperf` scripts are (the environment running this)."""


def _glmperf(*args: str, env: dict[str, str]) -> dict:
    out = subprocess.run([str(BIN / "glmperf"), *args, "--json"], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def _rounds(advice: dict) -> str:
    """Each measured range's probe rounds and the spread that widened it."""
    return "; ".join(f"{' '.join(f'{k}={v}' for k, v in r['set'].items())}: {r['expected']['probe']['rounds']} rounds, "
                     f"{r['expected']['tokens_per_s']['low']:+.1f}% to {r['expected']['tokens_per_s']['high']:+.1f}%, "
                     f"run-to-run {r['expected'].get('run_to_run', {}).get('tokens_per_s', 'not measured')}"
                     for r in advice["recommendations"] if r["expected"].get("source") == "measured") or "none measured"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, help="steps of the advised run (default 60)")
    p.add_argument("--repeats", type=int, help="runs of each side in the verification (default 3)")
    p.add_argument("--verify-steps", type=int, help="steps of each verification run (default 30)")
    p.add_argument("--quick", action="store_true", help="a 20-step run, 2 repeats of 15 steps")
    args = p.parse_args()
    mode = mode_label(args, ["steps", "repeats", "verify_steps"])
    args.steps = args.steps or (20 if args.quick else 60)
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.verify_steps = args.verify_steps or (15 if args.quick else 30)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GLMPERF_CACHE": str(Path(tmp) / "cache"), "GLMPERF_RUNS": str(Path(tmp) / "runs")}
        started = time.perf_counter()
        subprocess.run([str(BIN / "profile-run"), "--preset", "small", "--steps", str(args.steps),
                        "--name", "plain", "--no-progress"], env=env, check=True, stdout=subprocess.DEVNULL)
        run_s = time.perf_counter() - started
        started = time.perf_counter()
        cold = _glmperf("recommend", "plain", env=env)
        cold_s = time.perf_counter() - started
        started = time.perf_counter()
        _glmperf("recommend", "plain", env=env)
        warm_s = time.perf_counter() - started
        probed = [r for r in cold["recommendations"] if r["expected"].get("source") == "measured"]
        verified = _glmperf("recommend", "plain", "--verify", "--top", str(len(probed) or 1), "--repeats",
                            str(args.repeats), "--steps", str(args.verify_steps), "--no-progress", env=env)
        # the verification kept this machine's run-to-run spread: probes then stop once narrower than it
        shutil.rmtree(Path(tmp) / "cache" / "probes")
        started = time.perf_counter()
        known = _glmperf("recommend", "plain", env=env)
        known_s = time.perf_counter() - started
    rows = []
    for rec in probed:
        exp, probe = rec["expected"], rec["expected"]["probe"]
        tps = exp["tokens_per_s"]
        result = next((r for r in verified["verification"]["results"] if r["set"] == rec["set"]), {})
        m = result.get("measured") or {}
        measured = f"{m['change_pct']:+.1f}% [{m['low_pct']:+.1f}%, {m['high_pct']:+.1f}%]" if "change_pct" in m else ""
        inside = "yes" if m and tps["low"] <= m["change_pct"] <= tps["high"] else "no"
        rows.append([" ".join(f"{k}={v}" for k, v in rec["set"].items()), probe["rounds"], f"{probe['cost_s']:.1f} s",
                     f"{probe['one_off_s']:.1f} s", f"{100 * probe['cost_s'] / run_s:.0f}%",
                     f"{tps['point']:+.1f}% [{tps['low']:+.1f}%, {tps['high']:+.1f}%]", measured,
                     result.get("verdict", ""), inside])
    text = header("What a probe costs against the run it advises") + (
        f"- mode: {mode}\n- the run: `profile-run --preset small --steps {args.steps}`: {run_s:.1f} s from launch "
        f"to its end\n- `glmperf recommend RUN` with a cold probe cache: {cold_s:.1f} s ({100 * cold_s / run_s:.0f}% "
        f"of the run; probes {cold['probes']}); asked again: {warm_s:.1f} s\n- verification: `glmperf recommend RUN "
        f"--verify --repeats {args.repeats} --steps {args.verify_steps}` (99% intervals)\n- then with the spread that "
        f"verification measured and a cold probe cache again: {known_s:.1f} s ({100 * known_s / run_s:.0f}% of the "
        f"run; probes {known['probes']}; {_rounds(known)})\n\n")
    text += table(["change", "rounds", "probe cost", "of it one-off", "cost / run", "probed [90% interval]",
                   "verified [interval]", "verdict", "inside"], rows)
    write_result("probe_cost", text + "\n")


if __name__ == "__main__":
    main()
