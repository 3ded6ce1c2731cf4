"""`glmperf show RUN`: a run's summary table (computed from the flushed steps when it did not end) and
the top of its diagnosis. profile-run and finalize print the same."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.cli import common


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    common.add_run(subparsers.add_parser("show", help="a run's summary (also of a live or killed run)"))


def show(run_dir: Path, *, as_json: bool) -> str:
    """Print the run's summary and the head of its diagnosis; returns its status."""
    from profiler.analysis import summary_of
    from profiler.cli import console

    run = common.load_run(run_dir)
    summary = summary_of(run)
    if as_json:
        common.print_json({"id": run.id, "path": str(run.path), "status": run.status, "error": run.error,
                           "summary": summary, "diagnosis": run.record.get("diagnosis")})
        return run.status
    console.print_summary(run.record, summary, run.status, run.path, sys.stdout)
    console.print_advice_head(run.id, run.diagnosis, sys.stdout)
    return run.status


def main(args: argparse.Namespace) -> int:
    show(common.run_path(args), as_json=args.json)
    return common.EXIT_OK
