"""Command line: `profile-run` (measure a run) and `glmperf runs|show` (look at stored runs)."""

from __future__ import annotations

import argparse
import math
import os
import sys

# Before torch loads: kineto logs every profiler start/stop (USDT, STAGE lines) into the progress
# output; 6 silences its info levels, a user's own KINETO_LOG_LEVEL wins.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
from pathlib import Path
from typing import Any

from optimizers.config import ConfigError
from profiler import store
from profiler.config import load_config, shipped_presets


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="profile-run", description="Train the reference GLM with the chosen switches and measure it.",
        epilog="example: profile-run --preset small --set switches.amp=bf16 --steps 40")
    p.add_argument("--config", type=Path, help="YAML config file (sections: model, data, train, switches, "
                   "profile)")
    p.add_argument("--preset", help=f"shipped config: {', '.join(shipped_presets())}")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one value, e.g. switches.amp=bf16 (repeatable)")
    p.add_argument("--steps", type=int, help="shorthand for --set train.steps=N")
    p.add_argument("--name", help="run name (default: the config's)")
    p.add_argument("--runs-dir", type=Path, help="where runs go (default: $GLMPERF_RUNS or ./runs)")
    p.add_argument("--nproc", type=int, default=1, help="data-parallel ranks (torchrun; gloo on CPU, NCCL "
                   "on CUDA)")
    p.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                   help="record the torch.profiler window (default: the config's profile.trace)")
    p.add_argument("--no-progress", action="store_true", help="no live progress output")
    return p


def _fmt(value: Any, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value * scale:,.{digits}f}{unit}"


def summary_rows(record: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline figures of a run, as (name with unit, value) pairs."""
    s = record.get("summary") or {}
    st = s.get("step_time_s", {})
    share = s.get("phase_share", {})
    rows = [
        ("status", str(record.get("status"))),
        ("steps counted", f"{s.get('steps_counted', 0)} of {s.get('steps_total', 0)}"),
        ("throughput/tokens_per_s", _fmt(s.get("tokens_per_s"), digits=0)),
        ("time/step p50 (ms)", _fmt(st.get("p50"), scale=1e3, digits=1)),
        ("time/step p90 (ms)", _fmt(st.get("p90"), scale=1e3, digits=1)),
        ("time/step p99 (ms)", _fmt(st.get("p99"), scale=1e3, digits=1)),
    ]
    rows += [(f"time/{p} (%)", _fmt(share.get(p), scale=100, digits=1)) for p in
             ("data", "h2d", "forward", "backward", "optimizer", "comm") if p in share]
    rows += [
        ("memory/peak (GiB)", _fmt(s.get("peak_memory_bytes"), scale=2**-30, digits=2)
         + f"  [{s.get('peak_memory_source', '')}]"),
        ("mfu (%)", _fmt(s.get("mfu"), scale=100, digits=2)
         + f"  [peak {_fmt(s.get('peak_flops'), scale=1e-9, digits=0)} GFLOP/s, {s.get('peak_flops_source', '')}]"),
        ("loss first -> last", f"{_fmt(s.get('loss_first'), digits=4)} -> {_fmt(s.get('loss_last'), digits=4)}"),
    ]
    if record.get("error"):
        rows.append(("error", str(record["error"])))
    return rows


def print_summary(record: dict[str, Any], run_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {record.get('id')}", show_header=False)
    for name, value in summary_rows(record):
        table.add_row(name, value)
    console = Console()
    console.print(table)
    for note in (record.get("summary") or {}).get("notes", []):
        console.print(f"  note: {note}")
    console.print(f"run:    {run_dir}")
    report = run_dir / "report.html"
    console.print(f"report: {report if report.exists() else 'not rendered (reports come with the reports issue)'}")


def profile_run_main(argv: list[str] | None = None) -> int:
    args = _run_parser().parse_args(argv)
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.name is not None:
        overrides.append(f"name={args.name}")
    if args.trace is not None:
        overrides.append(f"profile.trace={str(args.trace).lower()}")
    try:
        cfg = load_config(config=args.config, preset=args.preset, overrides=overrides, nproc=args.nproc)
    except ConfigError as exc:
        print(f"profile-run: error: {exc}", file=sys.stderr)
        return 2
    from profiler.run import profile_run

    run_dir = profile_run(cfg, runs_dir=args.runs_dir, nproc=args.nproc, progress=not args.no_progress)
    record = store.read_run(run_dir)
    print_summary(record, run_dir)
    return {"completed": 0, "interrupted": 130}.get(record["status"], 1)


def _init_run(args: argparse.Namespace) -> int:
    from profiler.run import create_run_dir

    try:
        cfg = load_config(config=args.config, preset=args.preset, overrides=args.overrides, nproc=args.nproc)
    except ConfigError as exc:
        print(f"glmperf: error: {exc}", file=sys.stderr)
        return 2
    print(create_run_dir(cfg, runs_dir=args.runs_dir, nproc=args.nproc, launcher=False))
    return 0


def _finalize(run_dir: Path) -> int:
    from profiler.config import build_run_config
    from profiler.run import finalize

    if not (run_dir / "run.json").exists():
        print(f"glmperf: error: {run_dir} is not a run directory (no run.json)", file=sys.stderr)
        return 2
    record = store.read_run(run_dir)
    record = finalize(run_dir, build_run_config(record["config"]), world_size=int(record["world_size"]))
    print_summary(record, run_dir)
    return 0 if record["status"] == "completed" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmperf", description="glmperf: stored runs")
    sub = parser.add_subparsers(dest="command", required=True)
    runs = sub.add_parser("runs", help="list stored runs")
    runs.add_argument("--runs-dir", type=Path)
    show = sub.add_parser("show", help="a run's summary")
    show.add_argument("run", type=Path, help="run directory")
    init = sub.add_parser("init-run", help="validate a config and create a run for ranks started elsewhere "
                          "(torchrun on several nodes, Slurm); prints the run directory")
    init.add_argument("--config", type=Path)
    init.add_argument("--preset")
    init.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    init.add_argument("--nproc", type=int, required=True, help="the world size the ranks will have")
    init.add_argument("--runs-dir", type=Path)
    fin = sub.add_parser("finalize", help="merge the ranks' files of a run started with init-run, write its summary")
    fin.add_argument("run", type=Path, help="run directory")
    args = parser.parse_args(argv)
    if args.command == "init-run":
        return _init_run(args)
    if args.command == "finalize":
        return _finalize(args.run)
    if args.command == "runs":
        for r in store.list_runs(store.default_runs_dir(args.runs_dir)):
            tps = (r.get("summary") or {}).get("tokens_per_s")
            print(f"{r['id']:<48} {r['status']:<11} {_fmt(tps, digits=0):>10} tok/s  {r['path']}")
        return 0
    if not (args.run / "run.json").exists():
        print(f"glmperf: error: {args.run} is not a run directory (no run.json)", file=sys.stderr)
        return 2
    print_summary(store.read_run(args.run), args.run)
    return 0


if __name__ == "__main__":
    sys.exit(profile_run_main())
