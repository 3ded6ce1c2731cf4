"""`glmperf tune`: diagnose, verify and adopt recommendations until nothing left confirms.

    glmperf tune --preset small [--steps S] [--memory-budget-gb G] [--time-budget-min M]
                 [--repeats N] [--max-repeats M] [--allow-model-changes] [--output FILE]
    glmperf tune [--repeats N] [--max-repeats M] [--time-budget-min M] -- python train.py ...

The second form tunes one's own Hugging Face or Lightning training by rerunning its command with each
change (profiler.experiments.tune_command).

Exit 0 with a tuned config within the budget (possibly the starting one, when nothing confirmed);
1 when the tuned config still exceeds the memory budget; 2 on bad input; 130 on Ctrl-C (the rounds
done are kept in the record).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from profiler import store
from profiler.cli import common
from profiler.settings import settings_text, shipped_presets

DEFAULT_MAX_REPEATS = 6
"""profiler.experiments.tune.DEFAULT_MAX_REPEATS (not imported: the parser is built for every command)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune", help="from a plain config to the fastest one the advice can prove, within a memory budget",
        description="Diagnose a run of the config, verify the top recommendation against a fresh run, adopt it "
                    "when confirmed and within the memory budget, and repeat until nothing left confirms.",
        epilog="example: glmperf tune --preset small --steps 30 --memory-budget-gb 4")
    p.set_defaults(rerun=[])  # `-- COMMAND` (profiler.cli.main): one's own training, tuned by rerunning it
    p.usage = "glmperf tune (--preset NAME | --config FILE | -- COMMAND ...) [options]"
    p.epilog += ("; -- COMMAND: your own Hugging Face or Lightning training with the glmperf callback, tuned by "
                 "rerunning the command with each change (docs/own-training.md)")
    start = p.add_mutually_exclusive_group()
    common.add_preset(start, f"shipped config: {', '.join(shipped_presets())}")
    common.add_config(start, "YAML config file to start from")
    common.add_set(p, "override one value of the starting config (repeatable)")
    p.add_argument("--steps", type=common.positive_int, help="steps of every run (default: the config's)")
    p.add_argument("--memory-budget-gb", type=common.positive_float, help="peak memory the tuned config must fit (GiB; "
                   "default: the config's profile.memory_budget_gb, else no limit)")
    p.add_argument("--time-budget-min", type=common.positive_float, help="stop before a round that would overrun this")
    p.add_argument("--repeats", type=common.positive_int, default=2,
                   help="runs of each side a verification starts with (default 2)")
    p.add_argument("--max-repeats", type=common.positive_int,
                   help="runs of each side a verification may grow to while its verdict is open, one pair at a "
                        f"time, each look at a stricter confidence (default {DEFAULT_MAX_REPEATS}, or --repeats "
                        "when more)")
    p.add_argument("--max-rounds", type=common.positive_int, default=8,
                   help="recommendations tried at most (default 8); then one round may verify the changes together")
    p.add_argument("--allow-model-changes", action="store_true", help="also try changes that alter the model")
    p.add_argument("--probe-budget", type=common.non_negative_float, default=120.0, metavar="SECONDS",
                   help="seconds of what-if probes a round may spend ranking its candidates by their gain measured "
                        "on this machine (default 120; cached probes are free); 0: by the modelled ranges")
    p.add_argument("--output", type=Path, help="the tuned config (default: tuned.yaml beside the record)")
    common.add_runs_dir(p)
    p.add_argument("--no-progress", action="store_true")
    common.add_json(p, "print the record as JSON")


STOPPED = {"decided": "decided", "max_repeats": "still inconclusive at --max-repeats",
           "time_budget": "stopped: another repeat would overrun the time budget",
           "not_measured": "nothing measured", "interrupted": "interrupted"}
"""How a round's verification ended (verify.STOPS), as the summary says it."""


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GiB"


def _print(record: Mapping[str, Any], tuned_path: Path | None, out: TextIO) -> None:
    tuned = record.get("tuned") or {}
    took = tuned.get("tuning_s", record.get("elapsed_s", 0))
    print(f"tune {record['id']}: {len(record['rounds'])} round(s), {tuned.get('runs', 0)} run(s), {took:.0f} s; "
          f"stopped: {record.get('stopped')}", file=out)
    for e in record["rounds"]:
        change = settings_text(e["tried"])
        print(f"  round {e['round']}: {e['diagnosis']}", file=out)
        print(f"     tried {change}: {e['decision']}: {e['why']}", file=out)
        if "repeats" in e:
            how = STOPPED.get(str((e.get("result") or {}).get("stopped")), "")
            print(f"     {e['repeats']} run(s) a side; {how}", file=out)
    settings = (record.get("tuned") or {}).get("settings") or {}
    adopted = settings_text(settings) or ("nothing (the starting config stays)" if tuned_path else
                                          "nothing (the command stays as it is)")
    print(f"adopted: {adopted}", file=out)
    start, end = record["tuned"]["start"], record["tuned"]["end"]
    print(f"tokens/s: {start['tokens_per_s']:,.0f} (run {start['run']}) -> {end['tokens_per_s']:,.0f} "
          f"(run {end['run']}); peak memory {_gib(start['peak_memory_gib'])} -> {_gib(end['peak_memory_gib'])}",
          file=out)
    if tuned_path is not None:
        print(f"tuned config: {tuned_path}  (profile-run --config {tuned_path})", file=out)
    elif tuned.get("change"):
        print("the change to make:\n" + "\n".join(f"  {line}" for line in tuned["change"].splitlines()), file=out)


def _tune_command(args: argparse.Namespace) -> int:
    """tune -- COMMAND: one's own training tuned by rerunning its command."""
    from profiler.experiments.rerun import RerunError
    from profiler.experiments.tune_command import CommandTuner

    runs_dir = common.runs_dir(args)
    store.check_runs_dir(runs_dir)
    tuner = CommandTuner(args.rerun, runs_dir=runs_dir, repeats=args.repeats,
                         most=args.max_repeats or max(DEFAULT_MAX_REPEATS, args.repeats), max_rounds=args.max_rounds,
                         time_budget_s=60 * args.time_budget_min if args.time_budget_min else None,
                         allow_model_changes=args.allow_model_changes, progress=not args.no_progress)
    try:
        with common.bad_input_from(RerunError):
            record = tuner.run()
    except KeyboardInterrupt:
        print(f"tune interrupted: the record of the rounds done is {tuner.dir / 'tune.json'}", file=sys.stderr)
        return common.EXIT_INTERRUPTED
    if args.json:
        common.print_json(record)
    else:
        _print(record, None, sys.stdout)
    return common.EXIT_OK


def main(args: argparse.Namespace) -> int:
    from profiler.config import load_config
    from profiler.experiments.records import write_tuned
    from profiler.experiments.tune import Tuner, TuneSpec

    if args.max_repeats is not None and args.max_repeats < args.repeats:
        raise common.BadInput(f"--max-repeats: got {args.max_repeats}; allowed: at least --repeats ({args.repeats})")
    if bool(args.rerun) + bool(args.preset) + bool(args.config) != 1:
        raise common.BadInput("what to tune: got " + (", ".join(
            n for n, v in (("--preset", args.preset), ("--config", args.config), ("-- COMMAND", args.rerun)) if v)
            or "nothing") + "; allowed: exactly one of --preset NAME, --config FILE, -- COMMAND")
    if args.rerun:
        unused = [o for o, v in (("--set", args.overrides), ("--steps", args.steps), ("--output", args.output),
                                 ("--memory-budget-gb", args.memory_budget_gb)) if v]
        if unused:
            raise common.BadInput(f"{', '.join(unused)}: not for -- COMMAND, whose own arguments decide its runs")
        return _tune_command(args)
    overrides = list(args.overrides) + ([f"train.steps={args.steps}"] if args.steps else [])
    if args.memory_budget_gb:
        overrides.append(f"profile.memory_budget_gb={args.memory_budget_gb}")
    start = load_config(config=args.config, preset=args.preset, overrides=overrides)
    common.check_steps("--steps" if args.steps else "train.steps", start.train.steps, start.to_dict()["profile"])
    runs_dir = common.runs_dir(args)
    store.check_runs_dir(runs_dir)
    budget = start.profile.memory_budget_gb or None
    spec = TuneSpec(start, repeats=args.repeats, max_repeats=args.max_repeats, budget_gib=budget,
                    time_budget_s=60 * args.time_budget_min if args.time_budget_min else None,
                    allow_model_changes=args.allow_model_changes, max_rounds=args.max_rounds,
                    probe_budget_s=args.probe_budget,
                    source={"preset": args.preset, "config": str(args.config) if args.config else None,
                            "overrides": overrides})
    tuner = Tuner(spec, runs_dir=runs_dir, progress=not args.no_progress,
                  say=None if args.no_progress else common.status_line)
    try:
        record = tuner.run()
    except KeyboardInterrupt:
        print(f"tune interrupted: the record of the rounds done is {tuner.dir / 'tune.json'}", file=sys.stderr)
        return common.EXIT_INTERRUPTED
    path = write_tuned(record, tuner.dir, args.output)
    if args.json:
        common.print_json({**record, "tuned_config": str(path)})
    else:
        _print(record, path, sys.stdout)
    peak = record["tuned"]["end"]["peak_memory_gib"]
    if budget is not None and peak is not None and peak > budget:
        print(f"glmperf: the tuned config's peak memory {peak:.2f} GiB still exceeds the {budget:g} GiB budget: "
              "no recommendation that fits it was confirmed", file=sys.stderr)
        return common.EXIT_FINDING
    return common.EXIT_OK
