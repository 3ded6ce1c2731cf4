"""Command line: `profile-run` (measure a run) and `glmperf <command>` (everything else).

Every command takes `--runs-dir` (else $GLMPERF_RUNS, else ./runs), accepts a run as a directory,
a run id or a run name (the latest of that name), prints for people by default and JSON with
`--json`, and exits 0 on success, 1 on a finding that fails (a failed run), 2 on bad input with
one line naming what is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# Before torch loads: kineto logs every profiler start/stop (USDT, STAGE lines) into the progress
# output; 6 silences its info levels, a user's own KINETO_LOG_LEVEL wins.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
from pathlib import Path
from typing import Any

from optimizers.config import ConfigError
from profiler import plugins, store
from profiler.cli import compare as compare_cli
from profiler.cli import console
from profiler.cli import import_traces as import_cli
from profiler.cli import plan as plan_cli
from profiler.cli import sweep as sweep_cli
from profiler.cli import tune as tune_cli
from profiler.config import load_config
from profiler.settings import shipped_presets

EXIT_OK, EXIT_FINDING, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """Input the command cannot work with; its message is the one line the user sees."""


def _add_runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", type=Path, help="where runs are (default: $GLMPERF_RUNS or ./runs)")


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="profile-run", description="Train the reference GLM with the chosen switches and measure it.",
        epilog="example: profile-run --preset small --set switches.amp=bf16 --steps 40")
    p.add_argument("--config", type=Path, help="YAML config file (sections: model, data, train, switches, "
                   "profile)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--preset", help=f"shipped config: {', '.join(shipped_presets())}")
    start.add_argument("--from-run", metavar="RUN", help="start from a stored run's config (a run directory, id "
                       "or name), e.g. to rerun it with one change")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one value, e.g. switches.amp=bf16 (repeatable)")
    p.add_argument("--steps", type=int, help="shorthand for --set train.steps=N")
    p.add_argument("--name", help="run name (default: the config's)")
    _add_runs_dir(p)
    p.add_argument("--nproc", type=int, default=1, help="data-parallel ranks (torchrun; gloo on CPU, NCCL "
                   "on CUDA)")
    p.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                   help="record the torch.profiler window (default: the config's profile.trace)")
    p.add_argument("--no-progress", action="store_true", help="no live progress output")
    p.add_argument("--json", action="store_true", help="print the run's record as JSON instead of the table")
    return p


def _load(run_dir: Path) -> Any:
    from profiler.analysis import load_run

    run = load_run(run_dir)
    if run.problems:
        raise BadInput(f"run {run.id} is corrupt: {'; '.join(run.problems)}")
    return run


def _show(run_dir: Path, *, as_json: bool) -> str:
    """Print a run's summary (computed from the flushed steps when it did not end) and the top of its
    diagnosis; returns its status."""
    from profiler.analysis import summary_of

    run = _load(run_dir)
    summary = summary_of(run)
    if as_json:
        print(json.dumps({"id": run.id, "path": str(run.path), "status": run.status, "error": run.record.get("error"),
                          "summary": summary, "diagnosis": run.record.get("diagnosis")}, indent=2, default=str))
        return run.status
    console.print_summary(run.record, summary, run.status, run.path, sys.stdout)
    console.print_advice_head(run.id, run.record.get("diagnosis") or {}, sys.stdout)
    return run.status


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
        base = None
        if args.from_run is not None:
            base = store.read_run(store.resolve_run(args.from_run, store.default_runs_dir(args.runs_dir)))["config"]
        cfg = load_config(config=args.config, preset=args.preset, overrides=overrides, nproc=args.nproc, base=base)
        store.check_runs_dir(store.default_runs_dir(args.runs_dir))
    except (ConfigError, store.StoreError) as exc:
        print(f"profile-run: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from profiler.capture.run import profile_run

    run_dir = profile_run(cfg, runs_dir=args.runs_dir, nproc=args.nproc, progress=not args.no_progress)
    for name, outcome in plugins.after_run(run_dir):
        if not isinstance(outcome, Path):
            print(f"{name}: {outcome}", file=sys.stderr)
    try:
        status = _show(run_dir, as_json=args.json)
    except (BadInput, store.StoreError) as exc:
        print(f"profile-run: error: {exc}", file=sys.stderr)
        return EXIT_FINDING
    return {"completed": EXIT_OK, "interrupted": 130}.get(status, EXIT_FINDING)


def _init_run(args: argparse.Namespace) -> int:
    from profiler.capture.run import create_run_dir

    cfg = load_config(config=args.config, preset=args.preset, overrides=args.overrides, nproc=args.nproc)
    store.check_runs_dir(store.default_runs_dir(args.runs_dir))
    print(create_run_dir(cfg, runs_dir=args.runs_dir, nproc=args.nproc, launcher=False))
    return EXIT_OK


def _show_ok(args: argparse.Namespace, run_dir: Path) -> int:
    _show(run_dir, as_json=args.json)
    return EXIT_OK


def _finalize(args: argparse.Namespace, run_dir: Path) -> int:
    from profiler.capture.finish import finalize

    store.read_run(run_dir)  # a clear error before anything is moved
    finalize(run_dir)
    return EXIT_OK if _show(run_dir, as_json=args.json) == "completed" else EXIT_FINDING


def _runs(args: argparse.Namespace, runs_dir: Path) -> int:
    if not runs_dir.is_dir():
        raise BadInput(f"no runs directory at {runs_dir} (profile-run creates it; choose another with "
                       "--runs-dir or $GLMPERF_RUNS)")
    runs = store.list_runs(runs_dir)
    if args.json:
        print(json.dumps(runs, indent=2, default=str))
    elif not runs:
        print(f"no runs in {runs_dir}")
    else:
        console.print_runs(runs, sys.stdout)
    return EXIT_OK


def _advice(args: argparse.Namespace, run_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The run and its diagnosis with recommendations, computed now (also for runs stored before
    diagnosis existed, and with this command's options)."""
    from profiler.advice.recommend import advise
    from profiler.analysis import summary_of

    run = _load(run_dir)
    if not summary_of(run).get("steps_counted"):
        raise BadInput(f"run {run.id} has no counted step to diagnose ({run.status}; "
                       f"{'; '.join(summary_of(run).get('notes', []))})")
    return run, advise(run, allow_model_changes=getattr(args, "allow_model_changes", False),
                       top=getattr(args, "top", None))


def _diagnose(args: argparse.Namespace, run_dir: Path) -> int:
    run, advice = _advice(args, run_dir)
    if args.json:
        print(json.dumps({k: advice[k] for k in ("verdict", "bottlenecks", "skipped", "figures")}, indent=2,
                         default=str))
    else:
        console.print_diagnosis(run.id, advice, sys.stdout)
    return EXIT_OK


def _verify_options(args: argparse.Namespace, run: Any) -> tuple[int, int]:
    """--repeats and --steps, checked before any run starts."""
    from profiler.compare.stats import Options

    steps = args.steps if args.steps is not None else int(run.config["train"]["steps"])
    warmup = int(run.config["profile"]["warmup_steps"])
    least = warmup + Options().min_steps
    if args.repeats < 1:
        raise BadInput(f"--repeats: got {args.repeats}; allowed: an integer >= 1")
    if steps < least:
        raise BadInput(f"--steps: got {steps}; allowed: at least {least} (the run's {warmup} warmup steps and "
                       f"the {Options().min_steps} steady steps a comparison needs)")
    return args.repeats, steps


def _recommend(args: argparse.Namespace, run_dir: Path) -> int:
    run, advice = _advice(args, run_dir)
    verification = (run.record.get("diagnosis") or {}).get("verification")
    if args.verify:
        from profiler.experiments.batch import BatchInterrupted
        from profiler.experiments.verify import run_verification

        repeats, steps = _verify_options(args, run)
        if not args.json:
            console.print_diagnosis(run.id, advice, sys.stdout, evidence=False)
            console.print_recommendations(run.id, {**advice, "recommendations": advice["recommendations"][:args.top]},
                                          sys.stdout)
        try:
            verification = run_verification(run, advice, top=args.top or 3, repeats=repeats, steps=steps,
                                            runs_dir=store.default_runs_dir(args.runs_dir),
                                            progress=not args.no_progress)
        except BatchInterrupted:
            verification = store.read_run(run.path)["diagnosis"]["verification"]
            console.print_verification(run.id, verification, sys.stdout)
            return 130
    if args.json:
        keys = ("verdict", "bottlenecks", "recommendations", "excluded")
        print(json.dumps({**{k: advice[k] for k in keys}, "verification": verification}, indent=2, default=str))
        return EXIT_OK
    if not args.verify:
        console.print_diagnosis(run.id, advice, sys.stdout, evidence=False)
        console.print_recommendations(run.id, advice, sys.stdout)
    if verification:
        console.print_verification(run.id, verification, sys.stdout)
    return EXIT_OK


RUN_COMMANDS = {
    "show": ("a run's summary (also of a live or killed run)", _show_ok),
    "finalize": ("merge the ranks' files of a run (init-run, or killed) and store its summary", _finalize),
    "diagnose": ("what holds a run back: each bottleneck with its rule, threshold and evidence", _diagnose),
    "recommend": ("the switch changes that address a run's bottlenecks, ranked by expected gain", _recommend),
}


COMMAND_MODULES = {"compare": compare_cli, "sweep": sweep_cli, "tune": tune_cli, "import": import_cli,
                   "plan": plan_cli}
"""Commands with a module of their own: each has `add_parser(subparsers)` and `main(args) -> exit code`."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glmperf", description="glmperf: look at, diagnose and finish stored runs")
    sub = parser.add_subparsers(dest="command", required=True)
    runs = sub.add_parser("runs", help="list stored runs (corrupt ones with what is wrong)")
    _add_runs_dir(runs)
    runs.add_argument("--json", action="store_true")
    for name, (help_text, _) in RUN_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("run", help="run directory, run id or run name (the latest of that name)")
        _add_runs_dir(p)
        p.add_argument("--json", action="store_true")
        if name == "recommend":
            p.add_argument("--top", type=int, help="only the K best recommendations")
            p.add_argument("--allow-model-changes", action="store_true",
                           help="also list changes that alter the model (pruning, sharing, linear attention)")
            p.add_argument("--verify", action="store_true", help="rerun the run's config and the top recommendations "
                           "(--top, default 3) interleaved, and judge each by its measured gain")
            p.add_argument("--repeats", type=int, default=3, help="with --verify: runs of each side (default 3)")
            p.add_argument("--steps", type=int, help="with --verify: steps of each run (default: the run's own)")
            p.add_argument("--no-progress", action="store_true", help="with --verify: no progress output")
    for module in COMMAND_MODULES.values():
        module.add_parser(sub)
    plugins.add_parsers(sub)
    init = sub.add_parser("init-run", help="validate a config and create a run for ranks started elsewhere "
                          "(torchrun on several nodes, Slurm); prints the run directory")
    init.add_argument("--config", type=Path)
    init.add_argument("--preset")
    init.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    init.add_argument("--nproc", type=int, required=True, help="the world size the ranks will have")
    _add_runs_dir(init)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    runs_dir = store.default_runs_dir(args.runs_dir)
    try:
        if args.command == "init-run":
            return _init_run(args)
        if args.command == "runs":
            return _runs(args, runs_dir)
        if args.command in COMMAND_MODULES:
            return COMMAND_MODULES[args.command].main(args)
        if args.command in plugins.commands():
            return plugins.commands()[args.command].main(args)
        if getattr(args, "top", None) is not None and args.top < 1:
            raise BadInput(f"--top: got {args.top}; allowed: an integer >= 1")
        return RUN_COMMANDS[args.command][1](args, store.resolve_run(args.run, runs_dir))
    except (BadInput, ConfigError, store.StoreError) as exc:
        print(f"glmperf: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

