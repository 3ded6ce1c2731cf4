"""Parse once: one stored run (completed, failed, interrupted, live or killed) read into one object.

Everything that analyzes a run starts from `load_run`, which reads the run through
`profiler.store` (the only module that touches run directories): run.json, the steps, samples and
ops tables (compacted or, for a live or killed run, its flushed parts), the events and the ranks'
own status records. A table that cannot be read is empty in the object and named in `problems`,
so a damaged run is shown as `corrupt` with what is wrong, instead of as a healthy one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profiler import store


@dataclass
class RunData:
    """One run's stored files, read once. Pure data: analyzers take it and return figures."""

    path: Path
    record: dict[str, Any]
    """run.json, its status resolved (`incomplete` for a `running` run whose process is gone)."""
    steps: pd.DataFrame
    samples: pd.DataFrame
    ops: pd.DataFrame
    events: list[dict[str, Any]]
    ranks: list[dict[str, Any]]
    """Each rank's outcome: run.json's `ranks` once the run ended, else the ranks' live status files."""
    problems: list[str] = field(default_factory=list)
    """What is missing or unreadable; non-empty makes the status `corrupt`."""
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    """GPU kernel aggregates (kernels.parquet: imported traces); empty where the run has none."""

    @property
    def id(self) -> str:
        return str(self.record.get("id") or self.path.name)

    @property
    def status(self) -> str:
        return "corrupt" if self.problems else str(self.record.get("status"))

    @property
    def ended(self) -> bool:
        """True once the run was finalized (its summary in run.json is the stored one)."""
        return self.record.get("status") in store.FINAL_STATUSES

    @property
    def config(self) -> dict[str, Any]:
        return self.record.get("config") or {}

    @property
    def source(self) -> str:
        """What made the run: `profile-run` (also for runs stored without the field), `api`, `import`."""
        return str(self.record.get("source") or "profile-run")

    @property
    def world_size(self) -> int:
        return int(self.record.get("world_size") or 1)

    def rank(self, rank: int) -> dict[str, Any]:
        """That rank's status record, or {} when it wrote none."""
        return next((r for r in self.ranks if r.get("rank") == rank), {})


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
    return RunData(path=run_dir, record=record, steps=tables["steps"], samples=tables["samples"],
                   ops=tables["ops"], events=store.read_events(run_dir), ranks=ranks, problems=problems,
                   kernels=kernels)
