"""`glmperf compare`: baseline runs vs candidate runs as a CI gate.

    glmperf compare BASE CAND
    glmperf compare BASE... --vs CAND... [--metric NAME:THRESHOLD ...] [--gate FILE.yaml]
                    [--format text|markdown|json|junit] [--output FILE]

A run is a run directory, a run id or a run name in --runs-dir; a directory of runs stands for all
of them (the repeats of one side). Exit 0: no gated metric regressed (unchanged, improved or
inconclusive); 1: a gated metric regressed, or a gated loss curve drifted; 2: bad input (a missing,
corrupt or unfinished run, a run on both sides, runs of different models or shapes without
--allow-different-models, an unknown metric, a malformed gate file), in one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.cli import common
from profiler.compare.formats import FORMATS, RENDER, to_text
from profiler.compare.gate import COMPARABLE, Gate, GateError, make_gate
from profiler.compare.runs import compare
from profiler.compare.sides import load_sides
from profiler.compare.trace_diff import trace_diff, with_trace_diff
from profiler.settings import load_yaml_file


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `compare` on the glmperf command's subparsers."""
    p = subparsers.add_parser(
        "compare", help="baseline vs candidate runs, with statistics; exit 1 on a regression (a CI gate)",
        description="Compare baseline runs with candidate runs metric by metric (medians of the steady steps, "
                    "a confidence interval, a Mann-Whitney p-value, a verdict) and exit 1 when a gated metric "
                    "regressed beyond its threshold with confidence.",
        epilog="example: glmperf compare base-run --vs cand-run-1 cand-run-2 --metric step_time_p50:+5%")
    p.add_argument("runs", nargs="+", metavar="BASE", help="baseline run(s): directory, id, name, or a directory "
                   "of runs; without --vs, exactly BASE CAND")
    p.add_argument("--vs", nargs="+", metavar="CAND", help="candidate run(s)")
    p.add_argument("--metric", action="append", default=[], metavar="NAME:THRESHOLD",
                   help="gate a metric on a relative change in its bad direction, e.g. step_time_p50:+5%%, "
                        f"tokens_per_s:-5%%, peak_memory:+10%%, loss_parity:1%% (repeatable; known: "
                        f"{', '.join(COMPARABLE)})")
    p.add_argument("--gate", type=Path, metavar="FILE.yaml", help="a project's thresholds and options (docs/ci.md)")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    p.add_argument("--output", type=Path, metavar="FILE", help="write the --format output to FILE (the text "
                   "report still goes to stdout)")
    p.add_argument("--run-noise", type=common.non_negative_float, metavar="FRACTION", help="run-to-run noise "
                   "floor of the timing metrics with fewer than 3 runs a side (default 0.10)")
    p.add_argument("--confidence", type=common.finite_float, help="of the intervals (default 0.99)")
    p.add_argument("--allow-different-models", action="store_true", help="compare runs that train different "
                   "models or shapes (model, data.seq_len): refused otherwise, their figures compare workloads")
    common.add_runs_dir(p)


def _gate(args: argparse.Namespace) -> Gate:
    data = None if args.gate is None else load_yaml_file(args.gate, "--gate")
    source = "the command line" if args.gate is None else f"gate file {args.gate}"
    return make_gate(data, source=source, metrics=args.metric, run_noise=args.run_noise, confidence=args.confidence)


def main(args: argparse.Namespace) -> int:
    """Run `glmperf compare` with parsed arguments; returns the exit code."""
    if args.vs is None and len(args.runs) != 2:
        raise common.BadInput("compare takes BASE CAND, or BASE... --vs CAND...")
    base_refs, cand_refs = (args.runs[:1], args.runs[1:]) if args.vs is None else (args.runs, args.vs)
    with common.bad_input_from(GateError):
        gate = _gate(args)
        runs_dir = common.runs_dir(args)
        base_runs, cand_runs = load_sides(base_refs, cand_refs, runs_dir)
        result = compare(base_runs, cand_runs, gate)
    if result.different_models and not args.allow_different_models:
        raise common.BadInput(f"not comparable: the runs train different models or shapes: "
                              f"{result.different_models}; allowed: runs of one model and shape, or "
                              "--allow-different-models to compare the workloads")
    rendered = RENDER[args.format](result)
    if all(r.source == "import" for r in (*base_runs, *cand_runs)):  # traces: HTA's trace diff too
        rendered = with_trace_diff(rendered, args.format, trace_diff(base_runs, cand_runs))
    if args.output is not None:
        try:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(rendered, encoding="utf-8")
        except OSError as exc:
            raise common.BadInput(f"cannot write {args.output}: {exc.strerror or exc}") from None
        rendered = to_text(result)
    sys.stdout.write(rendered)
    return common.EXIT_FINDING if result.failures else common.EXIT_OK

