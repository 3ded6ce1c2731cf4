"""`glmperf recommend RUN`: the switch changes that address a run's bottlenecks, ranked by expected
gain (for a run of one's own training, the same changes in its framework's terms); with --verify, the
top ones rerun interleaved with a fresh baseline and judged by their measured gain (exit 130 when
interrupted, the verified part kept in the run's record). A run of one's own training is verified by
rerunning the command that trained it (`--verify -- COMMAND`: profiler.experiments.rerun)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from profiler import store, text
from profiler.cli import common
from profiler.cli.diagnose import diagnosable

if TYPE_CHECKING:
    from profiler.analysis import RunData


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("recommend", help="the switch changes that address a run's bottlenecks, ranked by "
                              "expected gain")
    common.add_run(p)
    p.add_argument("--top", type=common.positive_int, help="only the K best recommendations")
    p.add_argument("--allow-model-changes", action="store_true",
                   help="also list changes that alter the model (pruning, sharing, linear attention)")
    p.add_argument("--verify", action="store_true", help="rerun the run's config and the top recommendations "
                   "(--top, default 3) interleaved, and judge each by its measured gain")
    p.add_argument("--repeats", type=common.positive_int, default=3,
                   help="with --verify: runs of each side (default 3)")
    p.add_argument("--max-repeats", type=common.positive_int,
                   help="with --verify: add a repeat of the baseline and each inconclusive candidate, one at a time, "
                        "until decided or this many runs a side; each look at a stricter confidence "
                        "(default: --repeats, no repeat added)")
    p.add_argument("--steps", type=common.positive_int,
                   help="with --verify: steps of each run (default: the run's own)")
    p.add_argument("--probe-budget", type=common.non_negative_float, default=120.0, metavar="SECONDS",
                   help="measure each change's gain on this machine, side by side with the run's config, within "
                        "this many seconds in all (default 120; cached probes are free); 0: modelled ranges only")
    p.add_argument("--no-progress", action="store_true", help="no progress output (probes, --verify)")
    p.set_defaults(rerun=[])  # `-- COMMAND` (profiler.cli.main): the command that trained a run of one's own
    p.epilog = ("-- COMMAND: with --verify, on a run of your own Hugging Face or Lightning training: the command "
                "that trained it, rerun as it is and with each change (the glmperf callback applies it)")
    p.usage = "glmperf recommend RUN [options] [--verify [-- COMMAND ...]]"


def _verify_steps(args: argparse.Namespace, run: RunData) -> int:
    """--steps (else the run's own), checked before any run starts."""
    steps = args.steps if args.steps is not None else int(run.config["train"]["steps"])
    common.check_steps("--steps", steps, run.config["profile"])
    return steps


def _verify_command(args: argparse.Namespace, run: RunData, advice: dict) -> dict:
    """--verify -- COMMAND: the user's command rerun as it is and with each change; a command that cannot
    verify the advice (it fails, makes no run, or does not take a change) is bad input, in one line."""
    from profiler.experiments.rerun import RerunError, verify_command

    with common.bad_input_from(RerunError):
        return verify_command(run, advice, args.rerun, top=args.top or 3, repeats=args.repeats,
                              runs_dir=common.runs_dir(args), progress=not args.no_progress,
                              max_repeats=args.max_repeats)


def main(args: argparse.Namespace) -> int:
    from profiler.advice.advise import advise, keep_advice
    from profiler.advice.measured import ProbeBudget
    from profiler.cli import console

    run = diagnosable(common.run_path(args))
    if args.rerun and not args.verify:
        raise common.BadInput(f"-- {args.rerun[0]} ...: a command is rerun only with --verify")
    if args.verify:  # every refusal before any probe or run starts
        if run.source == "api" and not args.rerun:
            raise common.BadInput(text.rerun_own(run.id))
        if run.source != "api" and args.rerun:
            raise common.BadInput(f"-- {args.rerun[0]} ...: run {run.id} was made by profile-run, whose config "
                                  "--verify reruns itself; a command is for a run of your own training")
        if args.max_repeats is not None and args.max_repeats < args.repeats:
            raise common.BadInput(f"--max-repeats: got {args.max_repeats}; allowed: at least --repeats "
                                  f"({args.repeats})")
        steps = _verify_steps(args, run) if not args.rerun else 0
    probes = ProbeBudget(total_s=args.probe_budget) if args.probe_budget > 0 else None
    advice = advise(run, allow_model_changes=args.allow_model_changes, top=args.top, probes=probes,
                    progress=None if args.no_progress or args.json else common.status_line)
    if probes is not None:
        keep_advice(run, advice)
    verification = run.verification
    if args.verify:
        from profiler.experiments.batch import BatchInterrupted
        from profiler.experiments.sequential import run_verification

        if not args.json:
            console.print_diagnosis(run.id, advice, sys.stdout, evidence=False)
            console.print_recommendations(run.id, {**advice, "recommendations": advice["recommendations"][:args.top]},
                                          sys.stdout)
        try:
            if args.rerun:
                verification = _verify_command(args, run, advice)
            else:
                verification = run_verification(run, advice, top=args.top or 3, repeats=args.repeats, steps=steps,
                                                runs_dir=common.runs_dir(args), progress=not args.no_progress,
                                                max_repeats=args.max_repeats)
        except (BatchInterrupted, KeyboardInterrupt):
            verification = store.read_run(run.path)["diagnosis"]["verification"]
            console.print_verification(run.id, verification, sys.stdout)
            return common.EXIT_INTERRUPTED
    if args.json:
        keys = ("verdict", "representative", "not_representative", "bottlenecks", "recommendations", "excluded",
                "probes")
        common.print_json({**{k: advice[k] for k in keys if k in advice},
                           "verification": verification})
        return common.EXIT_OK
    if not args.verify:
        console.print_diagnosis(run.id, advice, sys.stdout, evidence=False)
        console.print_recommendations(run.id, advice, sys.stdout)
    if verification:
        console.print_verification(run.id, verification, sys.stdout)
    return common.EXIT_OK
