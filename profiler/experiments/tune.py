"""`glmperf tune`: from a plain config to the fastest one the advice can prove, within a memory budget.

Each round diagnoses the newest run of the current config, takes the best recommendation not tried
yet (when the run has no bottleneck: the best change that makes compute faster, as `explore`
ranks them), and verifies it against a fresh run of the current config (profiler.experiments.verify:
interleaved repeats, compare's statistics). It is adopted when confirmed and its runs' peak memory fits the
budget; otherwise the round records why it was refused and the next recommendation is tried. Tuning
stops when nothing untried is recommended, the next round would overrun the time budget, or after
`max_rounds`. A change that alters the model is never tried unless allowed.

The record (`<runs_dir>/tunes/<id>/tune.json`) holds every round: what was diagnosed, what was
tried, the measured gain and the decision; the tuned config is written as a YAML that
`profile-run --config` takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from profiler.advice.advise import advise
from profiler.analysis import RunData, load_run, summary_of
from profiler.config import RunConfig
from profiler.experiments import records
from profiler.experiments.batch import Cell, run_cells
from profiler.experiments.verify import judge_trials, runs_of, trials_for
from profiler.settings import settings_text

CONFIRMED = "confirmed"


@dataclass(frozen=True)
class TuneSpec:
    """What to tune and within what: the starting config and the limits."""

    start: RunConfig
    repeats: int = 2
    budget_gib: float | None = None
    time_budget_s: float | None = None
    allow_model_changes: bool = False
    max_rounds: int = 8
    source: Mapping[str, Any] | None = None
    """How the starting config was given (preset, config file, overrides), for the record."""


def _key(settings: Mapping[str, Any]) -> str:
    """One text per change, whatever names its fields were given by (a shorthand or the full path)."""
    return settings_text(records.canonical(settings))


def _peak_gib(runs: Sequence[RunData]) -> float | None:
    stored = [r.stored_summary or {} for r in runs]
    peaks = [float(s["peak_memory_bytes"]) / 2**30 for s in stored if s.get("peak_memory_bytes")]
    return max(peaks) if peaks else None


def _figures(run: RunData) -> dict[str, Any]:
    """The run's throughput and peak memory, as the tuned record states them."""
    return {"run": run.id, "tokens_per_s": summary_of(run).get("tokens_per_s"), "peak_memory_gib": _peak_gib([run])}


def _decide(result: Mapping[str, Any], cand: Sequence[RunData], budget: float | None) -> tuple[bool, str]:
    if result["verdict"] != CONFIRMED:
        return False, f"{result['verdict']}: {result['reason']}"
    peak = _peak_gib(cand)
    if budget is not None and peak is not None and peak > budget:
        return False, f"confirmed, but its peak memory {peak:.2f} GiB exceeds the {budget:g} GiB budget"
    return True, f"confirmed: {result['reason']}"


class Tuner:
    """One tuning session: its record on disk, rewritten after every round, so Ctrl-C keeps it."""

    def __init__(self, spec: TuneSpec, *, runs_dir: Path, progress: bool = True,
                 on_round: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        self.spec, self.runs_dir, self.progress, self.on_round = spec, runs_dir, progress, on_round
        self.started = time.perf_counter()
        self.cell_s: list[float] = []
        self.dir = records.create(runs_dir, "tune", spec.start.name, {"status": "running", "spec": {
            **(spec.source or {}), "repeats": spec.repeats, "memory_budget_gib": spec.budget_gib,
            "time_budget_s": spec.time_budget_s, "allow_model_changes": spec.allow_model_changes,
            "steps": spec.start.train.steps}, "rounds": [], "adopted": []})
        self.record = records.read(self.dir, "tune")

    def _save(self, **fields: Any) -> None:
        self.record.update(fields, elapsed_s=round(time.perf_counter() - self.started, 1))
        records.write(self.dir, "tune", self.record)

    def _cells(self, cells: Sequence[Cell]) -> list[tuple[Cell, Path]]:
        done = []
        for cell, run_dir in run_cells(cells, runs_dir=self.runs_dir, progress=self.progress):
            done.append((cell, run_dir))
            self.cell_s.append(time.perf_counter() - self.started - sum(self.cell_s))
        return done

    def _over_time(self, cells: int) -> bool:
        if self.spec.time_budget_s is None or not self.cell_s:
            return False
        expected = cells * sum(self.cell_s) / len(self.cell_s)
        return time.perf_counter() - self.started + expected > self.spec.time_budget_s

    def run(self) -> dict[str, Any]:
        """Tune until nothing left confirms or a budget is spent; returns the record."""
        try:
            return self._rounds()
        except KeyboardInterrupt:
            self._save(status="interrupted", stopped="interrupted (Ctrl-C): the rounds done are kept")
            raise

    def _rounds(self) -> dict[str, Any]:
        spec, current = self.spec, self.spec.start
        start_cell = Cell("start", current, links={"tune": {"id": self.dir.name, "round": 0, "trial": "start"}})
        newest = first = load_run(self._cells([start_cell])[0][1])
        self._save(start_run=newest.id)
        tried: set[str] = set()
        adopted: list[dict[str, Any]] = []
        stopped = f"{spec.max_rounds} rounds done"
        for round_no in range(1, spec.max_rounds + 1):
            # nothing holding the run back: try what makes compute faster
            advice = advise(newest, allow_model_changes=spec.allow_model_changes, explore_when_clear=True)
            todo = [r for r in advice["recommendations"] if _key(r["set"]) not in tried]
            diagnosis = advice["verdict"] + ("; trying what makes compute faster" if advice.get("explored") else "")
            if not todo:
                stopped = f"nothing left to try: {advice['verdict']}"
                break
            if self._over_time(2 * spec.repeats):
                stopped = "the time budget would be exceeded by another round"
                break
            rec = todo[0]
            tried.add(_key(rec["set"]))
            trials = trials_for(newest, [rec], repeats=spec.repeats, steps=current.train.steps,
                               name=f"{spec.start.name}.r{round_no}")
            cells = [Cell(c.label, c.cfg, nproc=c.nproc, links={**c.links, "tune": {"id": self.dir.name,
                          "round": round_no}}) for c in trials.cells]
            runs = runs_of(trials, self._cells(cells))
            result = judge_trials(trials, runs, budget_gib=spec.budget_gib)["results"][0]
            take, why = _decide(result, runs.get(trials.trials[-1].label, []), spec.budget_gib)
            entry = {"round": round_no, "diagnosed_run": newest.id, "diagnosis": diagnosis,
                     "bottlenecks": [b["kind"] for b in advice["bottlenecks"]], "tried": rec["set"],
                     "for": rec["for"], "expected": rec["expected"], "result": result,
                     "decision": "adopted" if take else "refused", "why": why}
            # the next diagnosis reads the first repeat: the one traced, with the operators its rules need
            if take:  # the candidate's config, under the name the tuning started with
                current = replace(trials.trials[-1].cfg, name=spec.start.name)
                adopted.append(dict(rec["set"]))
                newest = runs[trials.trials[-1].label][0]
            else:
                newest = runs["baseline"][0]
            self.record["rounds"].append(entry)
            self._save(adopted=adopted)
            if self.on_round:
                self.on_round(entry)
        tuned = {"settings": {k: v for s in adopted for k, v in records.canonical(s).items()},
                 "config": current.to_dict(),
                 "start": _figures(first), "end": _figures(newest)}
        self._save(status="completed", stopped=stopped, tuned=tuned)
        return self.record
