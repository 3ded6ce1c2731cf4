"""`glmperf tune -- COMMAND`: tune one's own Hugging Face or Lightning training by rerunning its command.

As profiler.experiments.tune does for a profile-run config: the command runs as it is; each round
diagnoses the newest run, takes the best recommendation in the framework's terms not tried yet (`order`)
that a rerun can pass (profiler.experiments.rerun), and verifies it against a fresh run with the changes
adopted so far, adding repeats while its verdict is open (profiler.experiments.sequential). A confirmed
change is adopted, and runs with every later round. The rounds stop when nothing untried can be
rerun, the time budget would be exceeded, or after `max_rounds`. The record
(`<runs_dir>/tunes/<id>/tune.json`) holds each round as a profile-run tuning's does, and the tuned
result as the changes to make in the framework's terms (`tuned.change`) and the overrides a rerun
passed (`tuned.overrides`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from profiler.advice.advise import advise
from profiler.advice.framework import change_text, framework_of
from profiler.analysis import RunData, load_run
from profiler.experiments.rerun import (
    CommandCell,
    RerunError,
    command_trials,
    execute,
    merged,
    more_cells,
    overrides_of,
    run_command,
)
from profiler.experiments.sequential import Sequential
from profiler.experiments.tune import CONFIRMED, Recorded, order, run_figures
from profiler.settings import settings_text


class CommandTuner(Recorded):
    """One tuning of a command (see the module docstring); a command that cannot verify the advice (it fails,
    makes no run or does not take a change) stops it, its record `failed`."""

    FAILS = (RerunError,)

    def __init__(self, argv: Sequence[str], *, runs_dir: Path, repeats: int = 2, most: int = 6, max_rounds: int = 8,
                 time_budget_s: float | None = None, allow_model_changes: bool = False, progress: bool = True,
                 on_round: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        self.argv, self.runs_dir, self.repeats, self.most = list(argv), runs_dir, repeats, most
        self.max_rounds, self.time_budget_s, self.allow = max_rounds, time_budget_s, allow_model_changes
        self.progress, self.on_round = progress, on_round
        self.base: dict[str, dict[str, Any]] = {}
        """The adopted changes, as the overrides every later rerun passes."""
        self._open(runs_dir, "command", {"command": self.argv, "repeats": repeats, "max_repeats": most,
                                         "max_rounds": max_rounds, "time_budget_s": time_budget_s,
                                         "allow_model_changes": allow_model_changes})

    def _run_all(self, cells: Sequence[CommandCell]) -> Iterator[tuple[CommandCell, Path]]:
        for cell, run_dir in execute(self.argv, runs_dir=self.runs_dir, progress=self.progress)(cells):
            self._ran()
            yield cell, run_dir

    def _rounds(self) -> dict[str, Any]:
        tune = {"tune": {"id": self.dir.name, "round": 0, "trial": "start"}}
        first = newest = load_run(run_command(self.argv, CommandCell("start", {}, tune), runs_dir=self.runs_dir,
                                              progress=self.progress))
        self._ran()
        self._save(start_run=first.id)
        adopted: list[dict[str, Any]] = []
        tried: set[str] = set()
        stopped = f"{self.max_rounds} rounds done"
        for round_no in range(1, self.max_rounds + 1):
            advice = advise(newest, allow_model_changes=self.allow)
            todo = order([r for r in advice["recommendations"] if settings_text(r["set"]) not in tried
                          and not isinstance(overrides_of(framework_of(newest)[0].name, r["set"]), str)])
            if not todo:
                stopped = f"nothing left a rerun can try: {advice['verdict']}"
                break
            if self._over_time(2 * self.repeats):
                stopped = "the time budget would be exceeded by another round"
                break
            rec = todo[0]
            tried.add(settings_text(rec["set"]))
            newest = self._round(round_no, newest, rec, adopted, advice["verdict"])
        said = {k: v for s in adopted for k, v in s.items()}
        tuned = {"settings": said, "overrides": self.base,
                 "change": change_text(said, str(first.device)) if said else "",
                 "start": run_figures(first), "end": run_figures(newest),
                 "tuning_s": round(time.perf_counter() - self.started, 1), "runs": len(self.ran_s)}
        self._save(status="completed", stopped=stopped, tuned=tuned)
        return self.record

    def _round(self, round_no: int, newest: RunData, rec: Mapping[str, Any], adopted: list[dict[str, Any]],
               diagnosis: str) -> RunData:
        """Verify `rec` with the adopted changes against them alone; the newest run after it."""
        t0 = time.perf_counter()
        links = {"tune": {"id": self.dir.name, "round": round_no}}
        trials = command_trials(newest, [rec], repeats=self.repeats, base=self.base, links=links)
        seq = Sequential(trials, most=self.most, more=functools.partial(more_cells, base=self.base, links=links),
                         keep_spread=False)
        result = seq.run(self._run_all, may_add=lambda cells: not self._over_time(cells))["results"][0]
        runs = seq.runs()
        take = result["verdict"] == CONFIRMED
        if take:
            adopted.append(dict(rec["set"]))
            self.base = merged(self.base, (trials.trials[-1].recommendation or {})["overrides"])
        entry = {"round": round_no, "kind": "change", "diagnosed_run": newest.id, "diagnosis": diagnosis,
                 "tried": dict(rec["set"]), "for": rec["for"], "expected": rec["expected"], "result": result,
                 "repeats": result["repeats"], "decision": "adopted" if take else "refused",
                 "why": f"{result['verdict']}: {result['reason']}", "round_s": round(time.perf_counter() - t0, 1)}
        self.record["rounds"].append(entry)
        self._save(adopted=list(adopted))
        if self.on_round:
            self.on_round(entry)
        side = runs.get(trials.trials[-1].label if take else "baseline") or [newest]
        return side[0]
