"""Parse once: one stored run (completed, failed, interrupted, live or killed) read into one object.

Everything that analyzes a run starts from `load_run`, which reads the run through
`profiler.store` (the only module that touches run directories): run.json, the steps, samples and
ops tables (compacted or, for a live or killed run, its flushed parts), the events and the ranks'
own status records. A table that cannot be read is empty in the object and named in `problems`,
so a damaged run is shown as `corrupt` with what is wrong, instead of as a healthy one.

The loaded run reads run.json through `RunRecord`'s accessors and computes the steps as the summary
counts them once (`merged_steps`, `steady_steps`), for the summary, the comparison and the figures alike.

A run directory started again (a requeue, a checkpoint resume) holds every attempt's rows; a step that
more than one attempt measured is the latest attempt's in `steps` (what every analysis reads), and the
attempts are described in `attempts`, as finalize stores them in run.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from profiler import store
from profiler.analysis.record import RunRecord
from profiler.analysis.steps import merge_ranks, steady_steps


@dataclass
class RunData(RunRecord):
    """One run's stored files, read once: run.json's accessors (`RunRecord`), the tables, and the steps
    as the summary counts them, computed once. Analyzers take it and return figures."""

    path: Path
    record: dict[str, Any]
    """run.json, its status resolved (`incomplete` for a `running` run whose process is gone)."""
    steps: pd.DataFrame
    """One row per step and rank: the latest attempt's where several measured it (all stay on disk)."""
    samples: pd.DataFrame
    ops: pd.DataFrame
    events: list[dict[str, Any]]
    ranks: list[dict[str, Any]]
    """Each rank's outcome: run.json's `ranks` once the run ended, else the ranks' live status files."""
    problems: list[str] = field(default_factory=list)
    """What is missing or unreadable; non-empty makes the status `corrupt`."""
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    """GPU kernel aggregates (kernels.parquet: imported traces); empty where the run has none."""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """Each attempt's steps (`latest_attempts`); empty for a run whose rows carry no attempt (imported)."""
    events_skipped: int = 0
    """events.jsonl lines that could not be read (cut short, not UTF-8, not an object) and were passed by."""

    @property
    def status(self) -> str:
        return "corrupt" if self.problems else self.recorded_status

    def rank(self, rank: int) -> dict[str, Any]:
        """That rank's status record, or {} when it wrote none."""
        return next((r for r in self.ranks if r.get("rank") == rank), {})

    @property
    def flops_per_token(self) -> float | None:
        """The model's FLOPs per token (model.flops_per_token; rank 0's own until the run ended)."""
        value = self.model.get("flops_per_token") or self.rank(0).get("flops_per_token")
        return float(value) if isinstance(value, (int, float)) else None

    @cached_property
    def _merged(self) -> tuple[pd.DataFrame, tuple[str, ...], str]:
        merged, notes, source = merge_ranks(self.steps, self.world_size)
        return merged, tuple(notes), source

    @property
    def merged_steps(self) -> pd.DataFrame:
        """One row per step across ranks (profiler.analysis.steps.merge_ranks): the loss curve."""
        return self._merged[0]

    @property
    def merge_notes(self) -> tuple[str, ...]:
        """Steps left out of `merged_steps` for a rank's sake (recorded by fewer than all ranks), and steps an
        earlier attempt measured that a later one measured again."""
        again = sum(a["superseded_steps"] for a in self.attempts)
        return self._merged[1] + ((f"{again} step(s) measured again by a later attempt: the latest attempt's "
                                   "rows are counted",) if again else ())

    @property
    def memory_source(self) -> str:
        """What `merged_steps.peak_memory_bytes` measures (CUDA allocator, RSS high-water mark, RSS)."""
        return self._merged[2]

    @cached_property
    def _steady(self) -> tuple[pd.DataFrame, tuple[str, ...]]:
        steady, notes = steady_steps(self.merged_steps, self.warmup_steps)
        return steady, tuple(notes)

    @property
    def steady_steps(self) -> pd.DataFrame:
        """The merged steps the summary counts: warmup, compile and profiled steps left out."""
        return self._steady[0]

    @property
    def steady_notes(self) -> tuple[str, ...]:
        """What `steady_steps` left out, and why."""
        return self._steady[1]


def latest_attempts(steps: pd.DataFrame) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The latest attempt's row of every (rank, step), and per attempt: `attempt`, `first_step`, `last_step`,
    `steps` (distinct steps it measured) and `superseded_steps` (of those, the ones a later attempt measured
    again)."""
    if steps.empty or "attempt" not in steps:
        return steps, []
    latest = steps
    if steps["attempt"].nunique() > 1:
        latest = steps.sort_values(["step", "rank", "attempt"], kind="stable").drop_duplicates(
            subset=["rank", "step"], keep="last").reset_index(drop=True)
    kept = set(zip(latest["attempt"], latest["step"], strict=True))
    attempts = []
    for attempt, rows in steps.groupby("attempt"):
        measured = set(rows["step"])
        attempts.append({"attempt": int(attempt), "first_step": int(min(measured)), "last_step": int(max(measured)),
                         "steps": len(measured),
                         "superseded_steps": sum((attempt, s) not in kept for s in measured)})
    return latest, attempts


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; raises `store.StoreError` (one clear line) when it holds no readable run."""
    run_dir = Path(run_dir)
    record = store.read_run(run_dir)
    problems = store.file_problems(run_dir, record)
    tables: dict[str, pd.DataFrame] = {}
    for table in store.TABLES:
        try:
            tables[table] = store.read_table(run_dir, table)
        except store.StoreError as exc:
            tables[table] = pd.DataFrame()
            if not any(table in p for p in problems):
                problems.append(str(exc))
    ranks = record.get("ranks") or store.read_rank_statuses(run_dir)
    try:
        kernels = store.read_table(run_dir, "kernels")
    except store.StoreError as exc:
        kernels = pd.DataFrame()
        problems.append(str(exc))
    steps, attempts = latest_attempts(tables["steps"])
    events, skipped = store.read_events(run_dir)
    return RunData(path=run_dir, record=record, steps=steps, samples=tables["samples"], ops=tables["ops"],
                   events=events, ranks=ranks, problems=problems, kernels=kernels, attempts=attempts,
                   events_skipped=skipped)
