"""`glmperf init-run`: validate a config and create a run for ranks started elsewhere (torchrun on
several nodes, Slurm); prints the run directory, which `glmperf finalize` ends."""

from __future__ import annotations

import argparse

from profiler import store
from profiler.cli import common


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("init-run", help="validate a config and create a run for ranks started elsewhere "
                              "(torchrun on several nodes, Slurm); prints the run directory")
    common.add_config(p)
    common.add_preset(p)
    common.add_set(p)
    p.add_argument("--nproc", type=int, required=True, help="the world size the ranks will have")
    common.add_runs_dir(p)


def main(args: argparse.Namespace) -> int:
    from profiler.capture.run import create_run_dir
    from profiler.config import load_config

    cfg = load_config(config=args.config, preset=args.preset, overrides=args.overrides, nproc=args.nproc)
    store.check_runs_dir(common.runs_dir(args))
    print(create_run_dir(cfg, runs_dir=args.runs_dir, nproc=args.nproc, launcher=False))
    return common.EXIT_OK
