"""`glmperf diagnose RUN`: what holds a run back, each bottleneck with its rule, threshold and evidence.

Computed now from the stored measurements (also for runs stored before diagnosis existed); the
diagnosis alone needs no torch, unlike the recommendations (`glmperf recommend`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.cli import common

if TYPE_CHECKING:
    from profiler.analysis import RunData


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    common.add_run(subparsers.add_parser(
        "diagnose", help="what holds a run back: each bottleneck with its rule, threshold and evidence"))


def diagnosable(run_dir: Path) -> RunData:
    """The run, refused in one line when it has no counted step to diagnose."""
    from profiler.analysis import summary_of

    run = common.load_run(run_dir)
    summary = summary_of(run)
    if not summary.get("steps_counted"):
        raise common.BadInput(f"run {run.id} has no counted step to diagnose ({run.status}; "
                              f"{'; '.join(summary.get('notes', []))})")
    return run


def main(args: argparse.Namespace) -> int:
    from profiler.advice.diagnose import diagnose
    from profiler.analysis import analyze, stored
    from profiler.cli import console

    run = diagnosable(common.run_path(args))
    figures = analyze(run)
    found = diagnose(figures)
    diagnosis = {**found, "figures": stored(figures)}
    if args.json:
        common.print_json(diagnosis)
    else:
        console.print_diagnosis(run.id, diagnosis, sys.stdout)
    return common.EXIT_OK
