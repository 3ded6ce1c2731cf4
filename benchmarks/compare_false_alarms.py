"""Does `glmperf compare` cry wolf, and what does it catch? Real `tiny` runs, one process each, as CI runs them.

    python -m benchmarks.compare_false_alarms [--quick]

1. False alarms: `--pairs` pairs of identical runs (same commit, same config), each pair run back to
   back; how many pairs compare's default gate flags `regressed`, next to what a bare 5% threshold
   on the mean step time would have flagged. Also the same runs pooled into sides of `--repeats`
   interleaved runs (runs as the unit).
2. Sensitivity: for each induced input slowdown (`data.io_delay_ms`), `--sensitivity-pairs` pairs of
   a baseline run of part 1 and a delayed run made in the same round; the smallest delay flagged
   in every pair.
3. This machine's A/A noise: the spread of the identical runs' median step times (the run-to-run
   noise floor compare assumes is 10%), and of their steps within a run.

Rounds interleave the variants (A, A', and each delay, in a rotating order), so a machine that gets
busier slows every variant alike. Every run is `profile-run --preset tiny --steps N --no-trace`,
pinned to one torch thread (`--run-threads`) as docs/ci.md advises.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import fmt, header, mode_label, table, write_result
from profiler.analysis import RunData, load_run
from profiler.analysis.steps import merge_ranks, steady_steps
from profiler.compare.gate import make_gate
from profiler.compare.runs import compare, contention
from profiler.compare.stats import DEFAULT_RUN_NOISE, robust_spread

ROOT = Path(__file__).resolve().parents[1]


def profile(runs_dir: Path, name: str, steps: int, delay_ms: float, threads: int) -> RunData:
    """One `profile-run` in its own process, as a CI job runs it, on `threads` torch threads."""
    proc = subprocess.run([sys.executable, "-m", "profiler.cli", "--preset", "tiny", "--steps", str(steps),
                           "--no-progress", "--no-trace", "--json", "--runs-dir", str(runs_dir), "--name", name,
                           "--set", f"data.io_delay_ms={delay_ms:g}"], cwd=ROOT, capture_output=True, text=True,
                          check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return load_run(json.loads(proc.stdout)["path"])


def steady(run: RunData) -> pd.DataFrame:
    """The steps the summary (and compare) count."""
    merged, _, _ = merge_ranks(run.steps, run.world_size)
    return steady_steps(merged, int(run.config["profile"]["warmup_steps"]))[0]


def steady_ms(run: RunData) -> np.ndarray:
    return steady(run)["step_s"].to_numpy() * 1e3


def verdict(base: list[RunData], cand: list[RunData]) -> tuple[str, str]:
    """The gate's overall verdict and step_time_p50's."""
    c = compare(base, cand, make_gate())
    return c.verdict, next(m.estimate.verdict for m in c.metrics if m.name == "step_time_p50")


def bare_mean_flags(base: RunData, cand: RunData, limit: float = 0.05) -> bool:
    return float(steady_ms(cand).mean()) / float(steady_ms(base).mean()) - 1 > limit


def counts(verdicts: list[str]) -> str:
    return ", ".join(f"{verdicts.count(v)} {v}" for v in ("regressed", "inconclusive", "unchanged", "improved")
                     if v in verdicts) or "none"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int)
    p.add_argument("--sensitivity-pairs", type=int)
    p.add_argument("--delays", type=float, nargs="+", help="data.io_delay_ms values (ms)")
    p.add_argument("--steps", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--run-threads", type=int, default=1, help="torch threads of each run (OMP_NUM_THREADS; "
                   "default 1, pinned as docs/ci.md advises)")
    p.add_argument("--keep", type=Path, help="keep the runs in this directory (default: a temporary one, removed)")
    p.add_argument("--quick", action="store_true", help="4 pairs, 2 sensitivity pairs, 2 delays")
    args = p.parse_args()
    mode = mode_label(args, ["pairs", "sensitivity_pairs", "delays", "steps", "repeats"])
    quick = args.quick
    pairs = args.pairs or (4 if quick else 20)
    sens = args.sensitivity_pairs or (2 if quick else 10)
    delays = args.delays or ([4.0, 16.0] if quick else [4.0, 8.0, 12.0, 16.0, 32.0])
    steps = args.steps or 30
    repeats = args.repeats or (2 if quick else 5)
    head = header("compare: false alarms and sensitivity (real tiny runs)")

    runs: dict[str, list[RunData]] = {"A": [], "B": [], **{f"d{d:g}": [] for d in delays}}
    with tempfile.TemporaryDirectory(prefix="glmperf-compare-") as tmp_dir:
        tmp = args.keep or tmp_dir
        for i in range(pairs):
            variants = ["A", "B", *([f"d{d:g}" for d in delays] if i < sens else [])]
            shift = i % len(variants)
            for v in variants[shift:] + variants[:shift]:
                delay = float(v[1:]) if v.startswith("d") else 0.0
                runs[v].append(profile(Path(tmp), f"{v}-{i}", steps, delay, args.run_threads))
                print(f"  round {i + 1}/{pairs}: {v} p50 {np.median(steady_ms(runs[v][-1])):.1f} ms",
                      file=sys.stderr, flush=True)
        aa = [verdict([a], [b]) for a, b in zip(runs["A"], runs["B"], strict=True)]
        bare = sum(bare_mean_flags(a, b) for a, b in zip(runs["A"], runs["B"], strict=True))
        groups = [(runs["A"][j:j + repeats], runs["B"][j:j + repeats]) for j in range(0, pairs - repeats + 1, repeats)]
        aa_repeats = [verdict(a, b) for a, b in groups]
        rows = []
        smallest = None
        for d in delays:
            got = [verdict([a], [c]) for a, c in zip(runs["A"], runs[f"d{d:g}"], strict=False)]
            flagged = sum(g[1] == "regressed" for g in got)
            slow = statistics.median(float(np.median(steady_ms(c))) / float(np.median(steady_ms(a))) - 1
                                     for a, c in zip(runs["A"], runs[f"d{d:g}"], strict=False))
            grouped = verdict(runs["A"][:repeats], runs[f"d{d:g}"][:repeats])[1] if sens >= repeats else "n/a"
            rows.append([f"{d:g}", f"{slow:+.0%}", f"{flagged} of {len(got)}", counts([g[1] for g in got]), grouped])
            if smallest is None and flagged == len(got):
                smallest = (d, slow)
        medians = np.array([np.median(steady_ms(r)) for r in runs["A"] + runs["B"]])
        pair_logs = np.array([math.log(np.median(steady_ms(b)) / np.median(steady_ms(a)))
                              for a, b in zip(runs["A"], runs["B"], strict=True)])
        spreads = [robust_spread(steady_ms(r)) for r in runs["A"] + runs["B"]]
        cvs = [float(np.std(x) / np.mean(x)) for x in map(steady_ms, runs["A"] + runs["B"])]
        every = [r for side in runs.values() for r in side]
        busy = [x for r in every if (x := contention(r, steady(r))) is not None]

    text = head + f"- mode: {mode}\n- runs: `profile-run --preset tiny --steps {steps} --no-trace` (one process " \
                  f"each, OMP_NUM_THREADS={args.run_threads}), {pairs} rounds interleaving A, A' and the delays; " \
                  "default gate (step_time_p50:+5%, " \
                  "tokens_per_s:-5%, peak_memory:+10%; 99% intervals; run-noise floor " \
                  f"{DEFAULT_RUN_NOISE['default']:.0%}, 0.5 x step spread on a busy machine)\n\n"
    text += "### False alarms (identical runs)\n\n" + table(
        ["comparison", "pairs", "flagged regressed by compare", "compare's verdicts (gate)",
         "flagged by a bare 5% threshold on the mean"],
        [["1 run vs 1 run", pairs, sum(v[0] == "regressed" for v in aa), counts([v[0] for v in aa]),
          f"{bare} of {pairs}"],
         [f"{repeats} vs {repeats} interleaved runs", len(groups), sum(v[0] == "regressed" for v in aa_repeats),
          counts([v[0] for v in aa_repeats]), "-"]])
    text += "\n### Sensitivity (a delayed candidate vs a baseline of the same round)\n\n" + table(
        ["data.io_delay_ms", "median slowdown", "step_time_p50 flagged (1 vs 1)", "verdicts (1 vs 1)",
         f"{repeats} vs {repeats} runs"], rows)
    found = (f"{smallest[0]:g} ms a step ({smallest[1]:+.0%} median step time)" if smallest
             else f"none of {', '.join(f'{d:g}' for d in delays)} ms")
    text += f"\nSmallest induced slowdown flagged in {sens} of {sens} pairs at {steps} steps a run: {found}.\n"
    text += ("\n### This machine's A/A noise\n\n"
             f"- median step time of the {len(medians)} identical runs: {fmt(medians.min(), '.1f')} to "
             f"{fmt(medians.max(), '.1f')} ms, cv {np.std(medians) / np.mean(medians):.1%}\n"
             f"- back-to-back pairs: sd of log(A'/A) {np.std(pair_logs):.3f}, i.e. "
             f"{np.std(pair_logs) / math.sqrt(2):.1%} a run (what the run-noise floor stands for)\n"
             f"- within a run: steps' cv {min(cvs):.0%} to {max(cvs):.0%}, robust spread (1.4826 MAD / median) "
             f"{min(spreads):.0%} to {max(spreads):.0%}\n"
             f"- CPU contention (other processes' share of the machine beyond the cores a run left free) over "
             f"all {len(every)} runs: median {np.median(busy):.0%}, largest {max(busy):.0%}; "
             f"{sum(x > 0.25 for x in busy)} runs above 25% (compare calls no speed regression on such a "
             "candidate)\n")
    write_result("compare_false_alarms", text)


if __name__ == "__main__":
    main()
