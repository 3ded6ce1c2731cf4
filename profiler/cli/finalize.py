"""`glmperf finalize RUN`: merge the ranks' files of a run started with init-run (or killed) and store
its summary; exit 1 unless the run completed.

A run still running is refused (its ranks still write parts that its end compacts). Stopped by Ctrl-C
(exit 130) or by a full disk (exit 2), the run keeps every flushed row and stays unfinished: running
finalize again finishes it.
"""

from __future__ import annotations

import argparse
import sys

from profiler import store
from profiler.cli import common
from profiler.cli.show import show


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    common.add_run(subparsers.add_parser(
        "finalize", help="merge the ranks' files of a run (init-run, or killed) and store its summary"))


def main(args: argparse.Namespace) -> int:
    from profiler.capture.finish import finalize

    run_dir = common.run_path(args)
    record = store.read_run(run_dir)  # a clear error before anything is moved
    if record["status"] == "running" and (what := store.alive(run_dir, record)):
        raise common.BadInput(f"run {record.get('id') or run_dir.name} is still running ({what}); "
                              "finalize it after it ends")
    try:
        finalize(run_dir)
    except KeyboardInterrupt:
        print(f"glmperf: finalize of run {run_dir.name} interrupted: its files are intact and it is not finalized; "
              "run glmperf finalize again to finish it", file=sys.stderr)
        return common.EXIT_INTERRUPTED
    except OSError as exc:  # what the store's own writes did not already name (a read, a removal)
        raise store.disk_error(exc, "finalizing", exc.filename or run_dir) from None
    return common.EXIT_OK if show(run_dir, as_json=args.json) == "completed" else common.EXIT_FINDING
