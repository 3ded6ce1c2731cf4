"""`profile-run`: train the reference GLM with the chosen switches, measure it, store the run and print
its summary. A one-process run that completed then probes its advice's changes (profiler.capture.end_probe),
so that `glmperf recommend` finds them measured. Exit 0 when the run completed, 1 when it failed, 2 on bad
input (before any work), 130 when interrupted (also while probing: the run stays completed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler import plugins, store
from profiler.cli import common
from profiler.cli.show import show
from profiler.settings import ProfileConfig, shipped_presets

PROG = "profile-run"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Train the reference GLM with the chosen switches and measure it.",
        epilog="example: profile-run --preset small --set switches.amp=bf16 --steps 40")
    common.add_config(p, "YAML config file (sections: model, data, train, switches, profile)")
    start = p.add_mutually_exclusive_group()
    common.add_preset(start, f"shipped config: {', '.join(shipped_presets())}")
    start.add_argument("--from-run", metavar="RUN", help="start from a stored run's config (a run directory, id "
                       "or name), e.g. to rerun it with one change")
    common.add_set(p, "override one value, e.g. switches.amp=bf16 (repeatable)")
    p.add_argument("--steps", type=int, help="shorthand for --set train.steps=N")
    p.add_argument("--name", help="run name (default: the config's)")
    common.add_runs_dir(p)
    p.add_argument("--nproc", type=int, default=1, help="data-parallel ranks (torchrun; gloo on CPU, NCCL "
                   "on CUDA)")
    p.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                   help="record the torch.profiler window (default: the config's profile.trace)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve live Prometheus metrics while it "
                   "runs (rank r on PORT + r); shorthand for --set profile.metrics_port=PORT (docs/monitoring.md)")
    p.add_argument("--probe-budget", type=common.non_negative_float, metavar="SECONDS",
                   help="at the end of a one-process run, measure its advice's changes on this machine, side by side "
                        "with its config, within this many seconds in all (as `glmperf recommend --probe-budget`; "
                        "compile is left to recommend), and cache them for recommend; 0: none; shorthand for "
                        f"--set profile.probe_budget_s=SECONDS (default {ProfileConfig.probe_budget_s:g})")
    p.add_argument("--no-progress", action="store_true", help="no live progress output")
    common.add_json(p, "print the run's record as JSON instead of the table")
    return p


def _overrides(args: argparse.Namespace) -> list[str]:
    """--set, then the shorthands (--steps, --name, --trace, --metrics-port, --probe-budget) as the --set values
    they stand for."""
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.name is not None:
        overrides.append(f"name={args.name}")
    if args.trace is not None:
        overrides.append(f"profile.trace={str(args.trace).lower()}")
    if args.metrics_port is not None:
        overrides.append(f"profile.metrics_port={args.metrics_port}")
    if args.probe_budget is not None:
        overrides.append(f"profile.probe_budget_s={args.probe_budget}")
    return overrides


def main(argv: list[str] | None = None) -> int:
    """The profile-run command; returns its exit code."""
    args = parser().parse_args(argv)
    from profiler.config import load_config

    try:
        base = None
        if args.from_run is not None:
            base = store.read_run(store.resolve_run(args.from_run, common.runs_dir(args)))["config"]
        cfg = load_config(config=args.config, preset=args.preset, overrides=_overrides(args), nproc=args.nproc,
                          base=base)
        store.check_runs_dir(common.runs_dir(args))
    except common.BAD_INPUT as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return common.EXIT_BAD_INPUT
    from profiler.capture.end_probe import probe_at_end
    from profiler.capture.run import Unfinished, profile_run
    from profiler.instruments.prometheus import PortError

    try:
        run_dir = profile_run(cfg, runs_dir=args.runs_dir, nproc=args.nproc, progress=not args.no_progress)
    except PortError as exc:  # refused before the run starts: nothing was created
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return common.EXIT_BAD_INPUT
    except Unfinished as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return common.EXIT_INTERRUPTED if exc.interrupted else common.EXIT_BAD_INPUT
    probed = probe_at_end(run_dir, budget_s=cfg.profile.probe_budget_s,
                          progress=None if args.no_progress else common.status_line)
    record = store.read_run(run_dir)
    if args.nproc > 1 and record.get("error"):  # torchrun's own report is long: it stays in the log
        print(f"{PROG}: {record['error']} (torchrun's output: {run_dir / store.LAUNCHER_LOG})", file=sys.stderr)
    for name, outcome in plugins.after_run(run_dir):
        if not isinstance(outcome, Path):
            print(f"{name}: {outcome}", file=sys.stderr)
    try:
        status = show(run_dir, as_json=args.json)
    except common.BAD_INPUT as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return common.EXIT_FINDING
    if probed is not None:
        print(probed.line, file=sys.stderr if args.json else sys.stdout)
        if probed.interrupted:
            return common.EXIT_INTERRUPTED
    return {"completed": common.EXIT_OK, "interrupted": common.EXIT_INTERRUPTED}.get(status, common.EXIT_FINDING)
