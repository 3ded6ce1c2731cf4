"""Advice on one's own training against its verification: the Hugging Face example, each recommendation's
expected range next to what rerunning the example with the change measured.

    python -m benchmarks.own_advice [--steps 40] [--repeats 3] [--max-repeats 6] [--quick]

Each scenario runs docs/examples/own_training_hf.py as a user does (a fresh runs directory and cache), asks
`glmperf recommend RUN --json` for its top changes (their ranges measured on the model at the train end
where the callback probed them, else modelled), then `glmperf recommend RUN --verify -- <the same command>`,
which reruns the command as it is and with each change, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import header, mode_label, table, write_result

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
EXAMPLE = [sys.executable, str(ROOT / "docs" / "examples" / "own_training_hf.py")]
SCENARIOS = (("fp32, hidden 512", ["--width", "512"]), ("slow reads: 20 ms a sample", ["--read-ms", "20"]))


def _glmperf(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "glmperf"), *args], capture_output=True, text=True, env=env, check=False)


def _range(expected: dict) -> str:
    tps = expected.get("tokens_per_s")
    return f"{tps['low']:+.0f}% to {tps['high']:+.0f}% ({expected['source']})" if tps else expected["source"]


def scenario(name: str, extra: list[str], args: argparse.Namespace, tmp: Path) -> list[list[object]]:
    runs = tmp / name.split(":")[0].replace(" ", "-").replace(",", "")
    env = {**os.environ, "GLMPERF_CACHE": str(tmp / "cache"), "GLMPERF_RUNS": str(runs)}
    command = [*EXAMPLE, "--runs-dir", str(runs), "--steps", str(args.steps), *extra]
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - started
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    probes = json.loads((run / "run.json").read_text()).get("own_probes") or []
    cost = sum(p["cost_s"] for p in probes)
    advice = json.loads(_glmperf("recommend", str(run), "--json", "--top", str(args.top), env=env).stdout)
    if not advice["recommendations"]:
        return [[name, f"{wall:.0f} s", "none", "", "", "", "", ""]]
    done = _glmperf("recommend", str(run), "--top", str(args.top), "--verify", "--repeats", str(args.repeats),
                    "--max-repeats", str(args.max_repeats), "--no-progress", "--", *command, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{name}: the verification failed: {done.stderr.strip()}")
    verification = json.loads((run / "run.json").read_text())["diagnosis"]["verification"]
    rows = []
    for rec, result in zip(advice["recommendations"], verification["results"], strict=True):
        m, tps = result.get("measured") or {}, rec["expected"].get("tokens_per_s")
        inside = "n/a" if not tps or "change_pct" not in m else \
            "yes" if tps["low"] <= m["change_pct"] <= tps["high"] else "no"
        measured = f"{m['change_pct']:+.1f}% [{m['low_pct']:+.1f}%, {m['high_pct']:+.1f}%]" if "change_pct" in m else ""
        rows.append([name, f"{wall:.0f} s (probe {cost:.1f} s)", rec["change"]["text"], _range(rec["expected"]),
                     measured, f"{len(result['runs'])} a side", result["verdict"], inside])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, help="steps of each run of the example (default 40)")
    p.add_argument("--repeats", type=int, help="runs a side the verification starts with (default 3)")
    p.add_argument("--max-repeats", type=int, help="runs a side it may grow to (default 6)")
    p.add_argument("--top", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="20 steps, 2 repeats, up to 3")
    args = p.parse_args()
    mode = mode_label(args, ["steps", "repeats", "max_repeats"])
    args.steps = args.steps or (20 if args.quick else 40)
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.max_repeats = args.max_repeats or (3 if args.quick else 6)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row for name, extra in SCENARIOS for row in scenario(name, extra, args, Path(tmp))]
    text = header("Advice on one's own training, verified by rerunning its command") + (
        f"- mode: {mode}\n- each: `python docs/examples/own_training_hf.py --steps {args.steps} ...`, then "
        f"`glmperf recommend RUN --top {args.top} --verify --repeats {args.repeats} --max-repeats "
        f"{args.max_repeats} -- <the same command>` (99% intervals)\n\n")
    text += table(["scenario", "the example's run", "recommendation", "expected", "measured [interval]", "runs",
                   "verdict", "inside"], rows)
    print(text)
    write_result("own_advice", text)


if __name__ == "__main__":
    main()
