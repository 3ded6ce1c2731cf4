"""Commands that live above profiler: `glmperf report`, `glmperf dashboard`, and what profile-run
writes when a run ends (the HTML report).

Imports point one way (optimizers <- reference_model <- profiler <- reports <- app), yet those
commands belong on the one `glmperf` command line. The packages above register them as entry
points in pyproject.toml (group `glmperf.commands`, name = the subcommand), and profiler finds
them by name through the installed package's metadata, never by importing them:

    [project.entry-points."glmperf.commands"]
    report = "reports.cli"

A command module is shaped like glmperf's own (profiler/cli/): `add_parser(subparsers)` (cheap:
import heavy libraries inside `main`) and `main(args) -> int` (exit code; bad input raises
profiler.cli.common.BadInput); it joins glmperf's table of commands (profiler.cli.main). It may
also have `after_run(run_dir) -> Path | None`, which profile-run calls when a run ends and whose
result (a file it wrote) it prints.
"""

from __future__ import annotations

import argparse
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

GROUP = "glmperf.commands"


class Command(Protocol):
    """A command module, glmperf's own or a plugin: what the command line calls on it."""

    def add_parser(self, subparsers: argparse._SubParsersAction) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


@cache
def commands() -> dict[str, Command]:
    """The registered command modules by subcommand name (none when the package is not installed)."""
    return {ep.name: ep.load() for ep in entry_points(group=GROUP)}


def after_run(run_dir: Path) -> list[tuple[str, Path | str]]:
    """What each command writes for a run that just ended: (command, its file, or why it wrote none).

    A failure here never costs the run: the run is stored before this is called."""
    written: list[tuple[str, Path | str]] = []
    for name, module in commands().items():
        hook = getattr(module, "after_run", None)
        if hook is None:
            continue
        try:
            path = hook(run_dir)
        except Exception as exc:
            written.append((name, f"not written: {type(exc).__name__}: {exc}"))
            continue
        if path is not None:
            written.append((name, path))
    return written
