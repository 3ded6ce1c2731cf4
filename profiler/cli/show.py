"""`glmperf show RUN`: a run's summary table (computed from the flushed steps when it did not end) and
the top of its diagnosis. profile-run and finalize print the same. A run `glmperf diagnose` refuses (no
counted step) gets no verdict: show prints its table, then diagnose's refusal, and exits 2 as diagnose does."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.cli import common
from profiler.cli.diagnose import refusal
from profiler.cli.import_traces import print_collectives


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    common.add_run(subparsers.add_parser("show", help="a run's summary (also of a live or killed run)"))


def show(run_dir: Path, *, as_json: bool) -> str:
    """Print the run's summary and the head of its diagnosis; returns its status."""
    return _print(run_dir, as_json=as_json)[0]


def _print(run_dir: Path, *, as_json: bool) -> tuple[str, str | None]:
    """Print the run's summary and, unless `glmperf diagnose` refuses the run, the head of its diagnosis;
    returns its status and diagnose's refusal (None when it diagnoses the run)."""
    from profiler.analysis import summary_of
    from profiler.cli import console

    run = common.load_run(run_dir)
    summary = summary_of(run)
    refused = refusal(run, summary)
    diagnosis = {} if refused else run.diagnosis
    if as_json:
        common.print_json({"id": run.id, "path": str(run.path), "status": run.status, "error": run.error,
                           "summary": summary, "diagnosis": diagnosis or None})
        return run.status, refused
    console.print_summary(run.record, summary, run.status, run.path, sys.stdout)
    print_collectives(summary.get("trace") or {}, sys.stdout)
    console.print_advice_head(run.id, diagnosis, sys.stdout)
    return run.status, refused


def main(args: argparse.Namespace) -> int:
    """The summary, then diagnose's refusal (exit 2) where diagnose refuses the run."""
    _, refused = _print(common.run_path(args), as_json=args.json)
    if refused:
        raise common.BadInput(refused)
    return common.EXIT_OK
