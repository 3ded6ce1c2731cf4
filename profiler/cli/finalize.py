"""`glmperf finalize RUN`: merge the ranks' files of a run started with init-run (or killed) and store
its summary; exit 1 unless the run completed."""

from __future__ import annotations

import argparse

from profiler import store
from profiler.cli import common
from profiler.cli.show import show


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    common.add_run(subparsers.add_parser(
        "finalize", help="merge the ranks' files of a run (init-run, or killed) and store its summary"))


def main(args: argparse.Namespace) -> int:
    from profiler.capture.finish import finalize

    run_dir = common.run_path(args)
    store.read_run(run_dir)  # a clear error before anything is moved
    finalize(run_dir)
    return common.EXIT_OK if show(run_dir, as_json=args.json) == "completed" else common.EXIT_FINDING
