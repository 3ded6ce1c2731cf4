"""`glmperf sweep`: run a grid of settings and read it as an ablation and a Pareto front.

    glmperf sweep --preset P | --config FILE [--set k=v ...] --grid section.key=v1,v2 [--grid ...]
                  [--repeats N] [--steps S] [--runs-dir DIR] [--json] [--no-progress]

Combinations the catalog rejects are refused up front and listed with the reason. The same command
started again resumes the newest unfinished sweep of the same spec, running only the repeats
without a completed run; once a sweep of that spec completed, it starts a new one. Exit 0: every
cell done; 1: a cell's run failed; 2: bad input (a malformed or unknown grid key, every cell
refused), in one line; 130: interrupted (the record keeps what is done).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from profiler import store
from profiler.cli import common
from profiler.metrics import METRIC_BY_NAME
from profiler.settings import settings_text, value_text
from profiler.text import fmt


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `sweep` on the glmperf command's subparsers."""
    p = subparsers.add_parser(
        "sweep", help="run a grid of switch settings: each key's effect with intervals, and the Pareto front",
        description="Run every combination of the --grid values as stored runs (refusing up front those the "
                    "catalog rejects), then report each cell's throughput and peak memory, each key's main "
                    "effect against its first value with an interval, notable interactions, and the Pareto "
                    "front of throughput against peak memory. Started again, it skips what is done.",
        epilog="example: glmperf sweep --preset tiny --grid switches.amp=off,bf16 "
               "--grid switches.attention=eager,sdpa --repeats 2 --steps 30")
    start = p.add_mutually_exclusive_group(required=True)
    common.add_preset(start, "shipped config to start from (configs/<preset>.yaml)")
    common.add_config(start, "YAML config file to start from")
    common.add_set(p, "override one value in every cell (repeatable)")
    p.add_argument("--grid", action="append", required=True, metavar="SECTION.KEY=V1,V2",
                   help="an axis of the grid: a key and at least 2 values, the first the reference (repeatable)")
    p.add_argument("--repeats", type=common.positive_int, default=1, help="runs per cell, interleaved (default 1)")
    p.add_argument("--steps", type=common.positive_int, help="train.steps of every cell (default: the config's)")
    common.add_runs_dir(p)
    common.add_json(p, "print the sweep record as JSON instead of the tables")
    p.add_argument("--no-progress", action="store_true", help="no live progress output")


def _figure_text(figure: dict[str, float] | None, digits: int) -> str:
    if figure is None:
        return "n/a"
    low, high = fmt(figure["low"], digits), fmt(figure["high"], digits)
    spread = f" [{low}-{high}]" if low != high else ""
    return f"{fmt(figure['median'], digits)}{spread}"


def _change(row: dict[str, Any]) -> str:
    interval = f" [{row['low_pct']:+.1f}% to {row['high_pct']:+.1f}%]" if row["low_pct"] is not None else ""
    return f"{row['change_pct']:+.1f}%{interval} ({row['pairs']} pair{'s' if row['pairs'] != 1 else ''})"


def print_sweep(record: dict[str, Any], path: Path, out: TextIO) -> None:
    """The cells, the ablation, the interactions, the Pareto front and the refused cells, in plain text."""
    from profiler.experiments import sweep

    spec = record["spec"]
    metrics = {name: METRIC_BY_NAME[m] for name, m in sweep.METRICS.items()}
    heads = {name: f"{m.label} ({m.unit})" for name, m in metrics.items()}
    print(f"sweep {record['id']}: {record['status']}, {len(record['cells'])} cell(s) x {spec['repeats']} "
          f"repeat(s) of {spec['steps']} steps (median [min-max] over repeats)", file=out)
    width = max(len("settings"), *(len(settings_text(c["settings"])) for c in record["cells"]))
    print(f"  {'cell':>4}  {'settings':<{width}}  {'status':<7}  {heads['tokens_per_s']:<24}  "
          f"{heads['peak_memory_gib']}", file=out)
    for c in record["cells"]:
        figures = [_figure_text(c[name], m.digits) for name, m in metrics.items()]
        print(f"  {c['index']:>4}  {settings_text(c['settings']):<{width}}  {c['status']:<7}  {figures[0]:<24}  "
              f"{figures[1]}", file=out)
    print(f"ablation: change against the key's first value, other keys held equal ({sweep.CONFIDENCE:.0%} t interval "
          "over the paired runs)", file=out)
    for row in record["ablation"]:
        what = f"{row['key']}={value_text(row['value'])} vs {value_text(row['reference'])}"
        print(f"  {what}: {metrics[row['metric']].label} {_change(row)}", file=out)
    if not record["ablation"]:
        print("  none yet: no pair of completed runs", file=out)
    print("interactions (beyond the noise):", file=out)
    for row in record["interactions"]:
        print(f"  {row['note']} ({_change(row)})", file=out)
    if not record["interactions"]:
        print(f"  none (a 2x2 contrast counts when its {sweep.CONFIDENCE:.0%} interval excludes no change; "
              "that takes 2 contrasts: a 2x2 grid needs --repeats 2)", file=out)
    front = ", ".join(str(i) for i in record["pareto"]) or "none yet"
    print(f"pareto front (no other cell both faster and leaner), leanest first: cell {front}", file=out)
    for r in record["refused"]:
        print(f"refused: {settings_text(r['settings'])}: {r['reason']}", file=out)
    print(f"record: {path}", file=out)


def main(args: argparse.Namespace) -> int:
    """Run `glmperf sweep` with parsed arguments; returns the exit code."""
    from profiler.experiments import records, sweep

    with common.bad_input_from(sweep.SweepError):
        spec = sweep.Spec(preset=args.preset, config=None if args.config is None else str(args.config),
                          grid=sweep.parse_grid(args.grid), overrides=list(args.overrides), repeats=args.repeats,
                          steps=args.steps)
        accepted, refused = sweep.expand(spec)
    runs_dir = common.runs_dir(args)
    store.check_runs_dir(runs_dir)
    record = sweep.new_record(spec, accepted, refused)
    same = sweep.same_sweeps(runs_dir, record)
    unfinished = next(((d, r) for d, r in same if sweep.todo(r)), None)
    if unfinished is not None:
        record_dir, record = unfinished
        total = len(record["cells"]) * spec.repeats
        print(f"resuming sweep {record['id']}: {total - len(sweep.todo(record))} of {total} runs done", file=sys.stderr)
    else:
        record_dir = records.create(runs_dir, sweep.KIND, spec.preset or Path(spec.config or "sweep").stem, record)
        record = records.read(record_dir, sweep.KIND)
        if same:
            print(f"sweep {same[0][1]['id']} of this spec is complete: starting a new one, {record['id']}",
                  file=sys.stderr)
    record = sweep.run_sweep(record_dir, record, [cfg for _, cfg in accepted], runs_dir=runs_dir,
                             progress=not args.no_progress)
    path = record_dir / f"{sweep.KIND}.json"
    if args.json:
        common.print_json(record)
    else:
        print_sweep(record, path, sys.stdout)
    if record["status"] == "interrupted":
        return common.EXIT_INTERRUPTED
    return common.EXIT_FINDING if any(c["status"] != "done" for c in record["cells"]) else common.EXIT_OK
