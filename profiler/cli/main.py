"""`glmperf <command>`: one table of commands, one parser, one place that turns bad input into a line.

Every command is a module with `add_parser(subparsers)` and `main(args) -> exit code` (profiler/cli/
for ours; the packages above profiler add theirs through profiler.plugins). Adding a command is its
module and one COMMANDS line. Every command that reads runs takes `--runs-dir` (else $GLMPERF_RUNS,
else ./runs) and accepts a run as a directory, a run id or a run name (the latest of that name);
one that prints a record prints it for people by default and as JSON with `--json`; every command
exits 0 on success, 1 on a finding that fails, 2 on bad input with one line naming what is wrong
(profiler.cli.common).

Importing a command module costs no torch: the commands that train or plan import it in `main`, so
`glmperf runs`, `show`, `diagnose` and `compare` start quickly.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from profiler import plugins
from profiler.cli import (
    common,
    compare,
    diagnose,
    finalize,
    import_traces,
    init_run,
    plan,
    recommend,
    runs,
    show,
    sweep,
    tune,
)

COMMANDS: dict[str, plugins.Command] = {
    "runs": runs, "show": show, "finalize": finalize, "diagnose": diagnose, "recommend": recommend,
    "compare": compare, "sweep": sweep, "tune": tune, "import": import_traces, "plan": plan, "init-run": init_run,
}
"""glmperf's own commands by name, in the order `glmperf --help` lists them (then the plugins')."""


def commands() -> dict[str, plugins.Command]:
    """Every command: ours, then those registered by the packages above profiler (report, dashboard)."""
    registered = plugins.commands()
    taken = sorted(set(registered) & set(COMMANDS))
    if taken:
        raise RuntimeError(f"entry points of group {plugins.GROUP} reuse glmperf's own command names: "
                           f"{', '.join(taken)}")
    return {**COMMANDS, **registered}


def parser(table: dict[str, plugins.Command]) -> argparse.ArgumentParser:
    p = common.Parser(prog="glmperf", description="glmperf: look at, diagnose and finish stored runs")
    sub = p.add_subparsers(dest="command", required=True)
    for module in table.values():
        module.add_parser(sub)
    return p


def _parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments; what follows the first `--` is a command to run (`args.rerun`), for the commands that
    take one (argparse cannot take a command's own options after a positional run)."""
    rest: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    args = p.parse_args(argv)
    if rest and not hasattr(args, "rerun"):
        raise common.BadInput(f"-- {shlex.join(rest)}: glmperf {args.command} runs no command")
    if hasattr(args, "rerun"):
        args.rerun = rest
    return args


EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a command whose reader went away (`glmperf show X | head`)."""


def main(argv: list[str] | None = None) -> int:
    """The glmperf command; returns its exit code."""
    table = commands()
    try:
        args = _parse(parser(table), sys.argv[1:] if argv is None else argv)
        code = table[args.command].main(args)
        sys.stdout.flush()  # here, where a reader gone away is caught, not at the interpreter's exit
        return code
    except common.BAD_INPUT as exc:
        print(f"glmperf: error: {exc}", file=sys.stderr)
        return common.EXIT_BAD_INPUT
    except BrokenPipeError:
        # the reader of stdout is gone: nothing more can be said to it, and Python's flush of stdout at
        # exit would fail again, so stdout becomes /dev/null (the recipe of Python's signal docs)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
