"""Does the advice hold when rerun? Each diagnosis scenario's top recommendation, verified.

    python -m benchmarks.verify_scenarios [--repeats N] [--steps N] [--only NAME ...]

For every scenario of benchmarks/diagnosis_scenarios.py that this machine can induce: a run of it,
its top recommendation, then `glmperf recommend RUN --verify --top 1` (profiler.experiments.verify: a fresh
baseline and the changed config, interleaved, `--repeats` runs each). The table sets the expected
range next to the measured change and its interval, with the verdict; "inside" says whether the
measured change lies in the expected range (a stability remedy has none). The scenarios share a cache of
their own: the first probed range has only the prior run-to-run spread (profiler.advice.spread), and
each verification's runs add to it ("run-to-run sigma": what widened the range).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import header, mode_label, table, write_result
from benchmarks.diagnosis_scenarios import SCENARIOS, Scenario
from profiler.advice.advise import advise
from profiler.advice.measured import ProbeBudget
from profiler.analysis import load_run
from profiler.config import load_config
from profiler.experiments.batch import Cell, run_cells
from profiler.experiments.sequential import run_verification


def _expected(rec: dict[str, Any]) -> tuple[float, float] | None:
    """The expected change of the judged metric, in the measured change's sense (a gain, a reduction)."""
    exp = rec["expected"] or {}
    if rec["judged_by"] == "tokens_per_s":
        return exp["tokens_per_s"]["low"], exp["tokens_per_s"]["high"]
    if rec["judged_by"] == "peak_memory" and "peak_memory" in exp:
        return -exp["peak_memory"]["high"], -exp["peak_memory"]["low"]
    return None


def verify(scenario: Scenario, runs_dir: Path, repeats: int, max_repeats: int, steps: int, probe_budget: float
           ) -> list[object]:
    cfg = load_config(preset=scenario.preset, overrides=[*scenario.overrides, f"train.steps={steps}"],
                      nproc=scenario.nproc)
    ((_, run_dir),) = run_cells([Cell(scenario.name, cfg, nproc=scenario.nproc)], runs_dir=runs_dir, progress=False)
    run = load_run(run_dir)
    advice = advise(run, probes=ProbeBudget(total_s=probe_budget) if probe_budget > 0 else None)
    first = advice["bottlenecks"][0]["kind"] if advice["bottlenecks"] else "none"
    if not advice["recommendations"]:
        return [scenario.name, first, "no recommendation", "", "", "", "", "", "", "", "", ""]
    verification = run_verification(run, advice, top=1, repeats=repeats, max_repeats=max_repeats, steps=steps,
                                    runs_dir=runs_dir,
                                    progress=False)
    (result,) = verification["results"]
    change = " ".join(f"{k}={v}" for k, v in result["set"].items())
    m = result.get("measured") or {}
    expected = _expected(result)
    if "change_pct" in m:
        measured = f"{m['change_pct']:+.1f}% [{m['low_pct']:+.1f}%, {m['high_pct']:+.1f}%] ({m['metric']})"
    else:
        measured = f"stability events {sum(m.get('base', []))} -> {sum(m.get('cand', []))}" if m else "not run"
    inside = "n/a" if expected is None or "change_pct" not in m else \
        "yes" if expected[0] <= m["change_pct"] <= expected[1] else "no"
    overlap = "n/a" if expected is None or inside == "n/a" else \
        "yes" if m["low_pct"] <= expected[1] and expected[0] <= m["high_pct"] else "no"
    exp_text = "steadier training" if expected is None else f"{expected[0]:+.0f}% to {expected[1]:+.0f}%"
    probe = (result["expected"] or {}).get("probe")
    spread = (result["expected"] or {}).get("run_to_run", {}).get("tokens_per_s")
    sigma = f"{spread['sigma_pct']:.1f}% ({spread['runs']} runs)" if spread else "not yet" if probe else ""
    source = (result["expected"] or {}).get("source", "modelled") if expected is not None else ""
    cost = f"{probe['cost_s']:.0f} s" if probe else ""
    runs = f"{result['repeats']} a side" if "repeats" in result else ""
    return [scenario.name, first, change, exp_text, source, cost, sigma, measured, runs, result["verdict"], inside,
            overlap]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--only", nargs="*", help="scenario names (default: all this machine can induce)")
    p.add_argument("--quick", action="store_true", help="2 repeats of 16 steps")
    p.add_argument("--max-repeats", type=int,
                   help="runs a side a verification may grow to while inconclusive (sequential; default 6)")
    p.add_argument("--probe-budget", type=float, default=120.0,
                   help="seconds of what-if probes per scenario, as `glmperf recommend` (0: modelled ranges)")
    args = p.parse_args()
    mode = mode_label(args, ["repeats", "steps", "only", "max_repeats"])
    repeats = args.repeats or (2 if args.quick else 3)
    steps = args.steps or (16 if args.quick else 24)
    # one torch thread, as the diagnosis scenarios run (their subprocesses get OMP_NUM_THREADS=1)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    chosen = [s for s in SCENARIOS if not s.skip and (not args.only or s.name in args.only)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # a cache of its own: no probe or run-to-run spread from an earlier session; each verification
        # adds its runs' spread, which widens the next scenarios' ranges as it would a user's
        os.environ["GLMPERF_CACHE"] = str(Path(tmp) / "cache")
        for s in chosen:
            print(f"verifying: {s.name}", flush=True)
            rows.append(verify(s, Path(tmp), repeats, max(repeats, args.max_repeats or 6), steps, args.probe_budget))
    inside = [r for r in rows if r[-2] in ("yes", "no")]
    text = header("Verified recommendations across the diagnosis scenarios") + (
        f"- mode: {mode}\n- each: the scenario's run, then `glmperf recommend RUN --verify --top 1 --repeats "
        f"{repeats} --max-repeats {max(repeats, args.max_repeats or 6)} --steps {steps} "
        f"--probe-budget {args.probe_budget:g}` (the expected range probed on this "
        "machine where a probe can measure it; fresh baseline and candidate interleaved, 99% intervals)\n\n")
    text += table(["scenario", "diagnosed first", "top recommendation", "expected", "source", "probe cost",
                   "run-to-run sigma", "measured [interval]", "runs", "verdict", "inside", "intervals overlap"], rows)
    text += (f"\n\nMeasured inside the expected range: {sum(r[-2] == 'yes' for r in inside)} of {len(inside)}; "
             f"the verification's interval overlapping the expected one: {sum(r[-1] == 'yes' for r in inside)} "
             f"of {len(inside)}.\n")
    skipped = [f"- {s.name}: {s.skip}" for s in SCENARIOS if s.skip]
    if skipped:
        text += "\nNot induced on this machine:\n" + "\n".join(skipped) + "\n"
    write_result("verify_scenarios", text)


if __name__ == "__main__":
    main()
