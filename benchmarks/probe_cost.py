"""What a probe costs against the run it advises, and what it measures against a verification.

    python -m benchmarks.probe_cost [--steps 60] [--pairs 3] [--repeats 3]

A `small` run (`profile-run --preset small`, fp32, the run a user starts with) probes its advice's
changes at its end, in its own process (profile-run's `--probe-budget`, default 10 s). Its cost is
timed from launch to exit against the same run with `--probe-budget 0`, side by side: pairs of runs
interleaved (ABBA), the probing side with a cold probe cache each time (a fresh $GLMPERF_CACHE, peaks
calibrated by a first run not counted; torch.compile's own cache stays warm, as on a machine that
compiled before); the cost is each pair's difference over its run without the end-probe. Then
`glmperf recommend RUN --json` on the last probing run (it reads the cache) and, for comparison, on a
run without its end-probe (it probes in its own fresh process). Each probed change is then verified
(`glmperf recommend RUN --verify`: fresh runs of the run's config and the change, interleaved), and
its measured gain set next to the probe's range. Last, with the run-to-run spread that verification
kept, one more run probes at its end from a cold probe cache.
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

from benchmarks.common import header, median, mode_label, table, write_result

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


def _profile_run(name: str, steps: int, env: dict[str, str], *budget: str) -> tuple[float, dict]:
    """One `profile-run --preset small` in its own process, as a user starts it: seconds from launch to exit,
    and its run.json."""
    started = time.perf_counter()
    out = subprocess.run([str(BIN / "profile-run"), "--preset", "small", "--steps", str(steps), "--name", name,
                          "--no-progress", "--json", *budget], env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    return wall, json.loads((Path(json.loads(out.stdout)["path"]) / "run.json").read_text())


def _pairs(pairs: int, steps: int, tmp: Path, env: dict[str, str]) -> tuple[list[float], list[float], list[dict]]:
    """Interleaved (ABBA) pairs of the run with its end-probe, from a cold probe cache, and with
    --probe-budget 0: each side's seconds from launch to exit, and the probing runs' run.json `end_probes`."""
    probing, plain, ends = [], [], []
    for i in range(pairs):
        for side in ("plain", "probed") if i % 2 == 0 else ("probed", "plain"):
            if side == "plain":
                plain.append(_profile_run("plain", steps, env, "--probe-budget", "0")[0])
                continue
            shutil.rmtree(tmp / "cache" / "probes", ignore_errors=True)
            wall, record = _profile_run("probed", steps, env)
            probing.append(wall)
            ends.append(record.get("end_probes") or {"error": record.get("end_probes_error")})
    return probing, plain, ends


def _spread(xs: list[float]) -> str:
    return f"{median(xs):.1f} s (" + ", ".join(f"{x:.1f}" for x in xs) + ")"


def _end(ends: list[dict]) -> str:
    """What the runs' end-probes measured, in how long (run.json `end_probes`)."""
    probed = "; ".join(f"{' '.join(f'{k}={v}' for k, v in c['set'].items())}: {c['state']}"
                       + (f", {c['rounds']} rounds, {c['cost_s']} s" if "rounds" in c else f" ({c.get('why')})")
                       for c in ends[-1].get("changes", [])) or f"nothing probed ({ends[-1]})"
    seconds = median([e.get("seconds", float("nan")) for e in ends])
    return f"{seconds:.1f} s in the run's process (median); last: {probed}"


def _counts(advice: dict) -> dict:
    """The advice's `probes` less the list of changes: budget, seconds spent, measured, cached."""
    return {k: v for k, v in advice["probes"].items() if k not in ("changes", "at_run_end")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, help="steps of the advised run (default 60)")
    p.add_argument("--pairs", type=int, help="interleaved pairs of runs with and without the end-probe (default 3)")
    p.add_argument("--repeats", type=int, help="runs of each side in the verification (default 3)")
    p.add_argument("--verify-steps", type=int, help="steps of each verification run (default 30)")
    p.add_argument("--quick", action="store_true", help="a 20-step run, 1 pair, 2 repeats of 16 steps")
    args = p.parse_args()
    mode = mode_label(args, ["steps", "pairs", "repeats", "verify_steps"])
    args.steps = args.steps or (20 if args.quick else 60)
    args.pairs = args.pairs or (1 if args.quick else 3)
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.verify_steps = args.verify_steps or (16 if args.quick else 30)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GLMPERF_CACHE": str(Path(tmp) / "cache"), "GLMPERF_RUNS": str(Path(tmp) / "runs")}
        # not counted: the peaks every run reads, measured once, and a first run's own slowness (18.8 s against
        # 13.2 s for the next 20-step run on the EPYC)
        _profile_run("first", args.steps, env, "--probe-budget", "0")
        probing, plain, ends = _pairs(args.pairs, args.steps, Path(tmp), env)
        costs = sorted(100 * (a - b) / b for a, b in zip(probing, plain, strict=True))
        started = time.perf_counter()
        cached = _glmperf("recommend", "probed", env=env)
        cached_s = time.perf_counter() - started
        shutil.rmtree(Path(tmp) / "cache" / "probes")
        started = time.perf_counter()
        cold = _glmperf("recommend", "plain", env=env)
        cold_s = time.perf_counter() - started
        probed = [r for r in cached["recommendations"] if r["expected"].get("source") == "measured"]
        verified = _glmperf("recommend", "probed", "--verify", "--top", str(len(probed) or 1), "--repeats",
                            str(args.repeats), "--steps", str(args.verify_steps), "--no-progress", env=env)
        # the verification kept this machine's run-to-run spread: probes then stop once narrower than it
        shutil.rmtree(Path(tmp) / "cache" / "probes")
        known_s, known_run = _profile_run("known", args.steps, env)
        known = _glmperf("recommend", "known", env=env)
    rows = []
    run_s = median(plain)
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
        f"- mode: {mode}\n- the run: `profile-run --preset small --steps {args.steps}`, {args.pairs} pair(s) "
        f"interleaved, seconds from launch to exit: with `--probe-budget 0` {_spread(plain)}; with its end-probe "
        f"(default budget, a cold probe cache each time) {_spread(probing)}\n- **the end-probe's cost: "
        f"{median(costs):+.1f}% of the run** (median of the pairs; each: {', '.join(f'{c:+.1f}%' for c in costs)}); "
        f"run.json `end_probes`: {_end(ends)}\n- then `glmperf recommend RUN` (the probes cached): {cached_s:.1f} s "
        f"(probes {_counts(cached)})\n- for comparison, `glmperf recommend` on the run without its end-probe, a cold "
        f"probe cache (it probes in its own fresh process): {cold_s:.1f} s ({100 * cold_s / run_s:.0f}% of the run; "
        f"probes {_counts(cold)})\n- verification: `glmperf recommend RUN --verify --repeats {args.repeats} --steps "
        f"{args.verify_steps}` (99% intervals)\n- then with the spread that verification measured and a cold probe "
        f"cache again: a run with its end-probe took {known_s:.1f} s, `end_probes` "
        f"{_end([known_run.get('end_probes') or {}])}; recommend: {_rounds(known)}\n\n")
    text += table(["change", "rounds", "probe cost", "of it one-off", "cost / run", "probed [90% interval]",
                   "verified [interval]", "verdict", "inside"], rows)
    write_result("probe_cost", text + "\n")


if __name__ == "__main__":
    main()
