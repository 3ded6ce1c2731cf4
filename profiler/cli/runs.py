"""`glmperf runs`: the stored runs, one line each (corrupt ones with what is wrong)."""

from __future__ import annotations

import argparse
import sys

from profiler import store
from profiler.cli import common


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("runs", help="list stored runs (corrupt ones with what is wrong)")
    common.add_runs_dir(p)
    common.add_json(p)


def main(args: argparse.Namespace) -> int:
    from profiler.cli import console

    runs_dir = common.runs_dir(args)
    if not runs_dir.is_dir():
        raise common.BadInput(f"no runs directory at {runs_dir} (profile-run creates it; choose another with "
                              "--runs-dir or $GLMPERF_RUNS)")
    runs = store.list_runs(runs_dir)
    if args.json:
        common.print_json(runs)
    elif not runs:
        print(f"no runs in {runs_dir}")
    else:
        console.print_runs(runs, sys.stdout)
    return common.EXIT_OK
