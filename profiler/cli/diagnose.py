"""`glmperf diagnose RUN`: what holds a run back, each bottleneck with its rule, threshold and evidence.

Computed now from the stored measurements (also for runs stored before diagnosis existed); the
diagnosis alone needs no torch, unlike the recommendations (`glmperf recommend`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.cli import common

if TYPE_CHECKING:
    from profiler.analysis import RunData


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    common.add_run(subparsers.add_parser(
        "diagnose", help="what holds a run back: each bottleneck with its rule, threshold and evidence"))


def refusal(run: RunData, summary: Mapping[str, Any]) -> str | None:
    """Why the run cannot be diagnosed, in one line (it has no counted step), or None. `glmperf show`
    refuses the same runs, so that it never prints a verdict that diagnose would refuse."""
    if summary.get("steps_counted"):
        return None
    return f"run {run.id} has no counted step to diagnose ({run.status}; {'; '.join(summary.get('notes', []))})"


def diagnosable(run_dir: Path) -> RunData:
    """The run, refused in one line when it has no counted step to diagnose."""
    from profiler.analysis import summary_of

    run = common.load_run(run_dir)
    if why := refusal(run, summary_of(run)):
        raise common.BadInput(why)
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
