"""`glmperf import TRACE_DIR`: existing torch.profiler traces as a run (being built)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("import", help="import existing torch.profiler traces (one chrome JSON per rank) as a run")


def main(args: argparse.Namespace) -> int:
    raise NotImplementedError
