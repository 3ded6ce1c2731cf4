"""`glmperf plan`: per-rank memory and communication of a layout before running it (being built)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("plan", help="per-rank memory and communication of a config's layout, without running it")


def main(args: argparse.Namespace) -> int:
    raise NotImplementedError
