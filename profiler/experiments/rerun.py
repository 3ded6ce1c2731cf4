"""Prove the advice on one's own training: rerun the user's command as it is and with each recommended
change, interleaved, and judge each change by compare's statistics, as profiler.experiments.verify does
for profile-run runs (`glmperf recommend RUN --verify -- COMMAND`).

The user does not edit the script for each change. The rerun passes the change in the environment
(`OVERRIDES`, JSON `{owner: {name: value}}`), and the framework callback applies it before the
framework reads its settings: the Hugging Face callback to every `TrainingArguments` built in the
process, the Lightning callback to the `Trainer`'s arguments (profiler.integrations). A change of
anything else (the module's code, a DataLoader, a plain loop) is refused up front, as is a run of a
plain loop. Each rerun names the run it made in a file (`RUN_FILE`); the rerun checks that the run
recorded the change (run.json config.framework.settings), so a script that builds its arguments
before importing the callback is refused in one line instead of measured unchanged.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler import store
from profiler.advice.framework import framework_of
from profiler.analysis import RunData
from profiler.experiments.sequential import Execute, Sequential
from profiler.experiments.verify import Trial, Trials, store_verification
from profiler.settings import RERUN_OVERRIDES as OVERRIDES
from profiler.settings import RERUN_RUN_FILE as RUN_FILE

Overrides = Mapping[str, Mapping[str, Any]]
"""Settings by owner: {"TrainingArguments": {"bf16": True}}."""
TAKES = {"hf": ("TrainingArguments",), "lightning": ("L.Trainer",)}
"""What the callback of each framework can change before the framework reads it."""
TAIL = 8
"""Lines of a failed command's output shown."""


class RerunError(ValueError):
    """The command cannot verify the advice (it failed, made no run, or did not take a change): one line."""


@dataclass(frozen=True)
class CommandCell:
    """One run of the user's command: with which overrides, and what it links to."""

    label: str
    overrides: Mapping[str, Mapping[str, Any]]
    links: Mapping[str, Any] = field(default_factory=dict)


def overrides_of(framework: str, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]] | str:
    """A recommendation's settings (`Owner.name` -> value) as overrides by owner, or why a rerun cannot
    make them."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        owner, _, name = key.rpartition(".")
        if owner not in TAKES.get(framework, ()):
            return (f"{owner or key} is not a setting a rerun can pass (it changes: "
                    f"{', '.join(TAKES.get(framework, ())) or 'nothing'}): make the change and compare the runs")
        out.setdefault(owner, {})[name] = value
    return out


def command_trials(run: RunData, recommendations: Sequence[Mapping[str, Any]], *, repeats: int,
                   base: Overrides | None = None, links: Mapping[str, Any] | None = None) -> Trials:
    """The baseline and each recommendation a rerun can make, their interleaved cells; the others refused
    with why. `base`: overrides every side runs with (the changes a tuning adopted); `links`: more run.json
    links for every run. Raises RerunError when the run's framework takes none."""
    framework = framework_of(run)[0].name
    if framework not in TAKES:
        raise RerunError(f"run {run.id} is a plain training loop: its changes are code, which a rerun cannot make; "
                         f"make the change, run again and compare the runs: glmperf compare {run.id} NEW_RUN")
    trials, refused = [Trial("baseline", None, None)], []
    for rec in recommendations:
        made = overrides_of(framework, rec["set"])
        if isinstance(made, str):
            refused.append({"label": str(rec["switch"]), "reason": made})
        else:
            trials.append(Trial(str(rec["switch"]), {**rec, "overrides": made}, None))
    if len(trials) == 1:
        raise RerunError("no recommendation is a setting a rerun can pass: " + "; ".join(r["reason"] for r in refused))
    cells = tuple(c for r in range(repeats) for c in command_cells(trials, run.id, r, repeats, base or {}, links))
    return Trials(run.id, tuple(trials), tuple(refused), cells, repeats, steps=0)


def merged(*overrides: Overrides) -> dict[str, dict[str, Any]]:
    """Overrides by owner, later ones winning name by name."""
    out: dict[str, dict[str, Any]] = {}
    for each in overrides:
        for owner, values in each.items():
            out.setdefault(owner, {}).update(values)
    return out


def command_cells(trials: Sequence[Trial], verified: str, repeat: int, of: int, base: Overrides,
                  links: Mapping[str, Any] | None = None) -> list[CommandCell]:
    return [CommandCell(f"{t.label} (repeat {repeat + 1}/{of})",
                        merged(base, (t.recommendation or {}).get("overrides", {})),
                        {"verifies": {"run": verified, "trial": t.label, "repeat": repeat}, **(links or {})})
            for t in trials]


def more_cells(trials: Trials, repeat: int, labels: Sequence[str], *, of: int, base: Overrides | None = None,
               links: Mapping[str, Any] | None = None) -> tuple[CommandCell, ...]:
    """Sequential's cells of one more repeat of the trials named in `labels` (with functools.partial: the
    base overrides and extra links of a tuning's round)."""
    return tuple(command_cells([t for t in trials.trials if t.label in labels], trials.verified, repeat, of,
                               base or {}, links))


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-TAIL:]) if lines else "no output"


def run_command(argv: Sequence[str], cell: CommandCell, *, runs_dir: Path, progress: bool = True) -> Path:
    """Run the command once with the cell's overrides; the run directory it made, linked to the cell."""
    with tempfile.TemporaryDirectory(prefix="glmperf-rerun-") as tmp:
        named = Path(tmp) / "runs"
        env = {**os.environ, "GLMPERF_RUNS": str(runs_dir), OVERRIDES: json.dumps(cell.overrides),
               RUN_FILE: str(named)}
        if progress:
            print(f"  {cell.label}: {shlex.join(argv)} ...", file=sys.stderr, flush=True)
        try:
            done = subprocess.run(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  check=False)
        except OSError as exc:
            raise RerunError(f"cannot run {shlex.join(argv)}: {exc}") from None
        made = [Path(line) for line in named.read_text().splitlines()] if named.exists() else []
    if not made:
        raise RerunError(f"{shlex.join(argv)} (exit {done.returncode}) made no glmperf run: the command must train "
                         f"with the glmperf callback; its output: {_tail(done.stdout)}")
    run_dir = made[-1]
    if cell.overrides:
        _check_taken(run_dir, cell)
    if done.returncode != 0 and (cell.links.get("verifies") or {}).get("trial", "baseline") == "baseline":
        raise RerunError(f"{shlex.join(argv)} failed (exit {done.returncode}) without the change tried: "
                         f"{_tail(done.stdout)}")
    store.update_run(run_dir, **cell.links)
    return run_dir


def _check_taken(run_dir: Path, cell: CommandCell) -> None:
    """Refuse a rerun whose run did not record a change it was asked to make."""
    settings = ((store.read_run(run_dir).get("config") or {}).get("framework") or {}).get("settings") or {}
    for owner, changes in cell.overrides.items():
        for name, value in changes.items():
            if name in settings and settings[name] != value:
                raise RerunError(f"the command did not take {owner}(..., {name}={value!r}): its run recorded "
                                 f"{name}={settings[name]!r}; import the glmperf callback before the {owner} are built")


def execute(argv: Sequence[str], *, runs_dir: Path, progress: bool = True) -> Execute:
    """Sequential's `execute`: each cell run as the command, in order."""
    def run_all(cells: Sequence[CommandCell]) -> Iterator[tuple[CommandCell, Path]]:
        for cell in cells:
            yield cell, run_command(argv, cell, runs_dir=runs_dir, progress=progress)
    return run_all


def verify_command(run: RunData, advice: Mapping[str, Any], argv: Sequence[str], *, top: int, repeats: int,
                   runs_dir: Path, progress: bool = True, max_repeats: int | None = None) -> dict[str, Any]:
    """Rerun `argv` as it is and with each of the `top` recommendations, store the verdicts in the run (also
    when Ctrl-C stops it) and return them (`judge_trials`' shape, with the command)."""
    trials = command_trials(run, advice["recommendations"][:top], repeats=repeats)
    seq = Sequential(trials, most=max_repeats, budget_gib=run.memory_budget_gb or None, more=more_cells,
                     keep_spread=False)  # a script's runs vary with its own start-up and data, not only the machine
    try:
        seq.run(execute(argv, runs_dir=runs_dir, progress=progress))
    except RerunError:
        raise  # the command cannot verify the advice: what the run stored of an earlier verification stays
    except BaseException:
        store_verification(run.path, {**seq.verification(), "command": list(argv)}, advice)  # Ctrl-C: what ran
        raise
    verification = {**seq.verification(), "command": list(argv)}
    store_verification(run.path, verification, advice)
    return verification
