"""The runs on each side of a comparison, as a user names them: `glmperf compare`, `glmperf report
--compare` and the dashboard's Compare page read them the same way and refuse the same things."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from profiler import store
from profiler.analysis import RunData, load_run


class NotComparable(store.StoreError):
    """Sides that cannot be compared (a run on both): said in one line, before any statistics."""


def _load(path: Path) -> RunData:
    run = load_run(path)
    if run.problems:
        raise store.StoreError(f"run {run.id} is corrupt: {'; '.join(run.problems)}")
    if run.status != "completed":
        raise store.StoreError(f"run {run.id} is {run.status}, not completed: compare needs finished runs")
    return run


def load_side(refs: Sequence[str], runs_dir: Path) -> list[RunData]:
    """The runs a side names, a directory of runs expanded to all of them."""
    out = []
    for ref in refs:
        path = store.resolve_run(ref, runs_dir)
        try:
            out.append(_load(path))
        except store.StoreError:
            listed = store.list_runs(path)  # a directory of runs (a run's own directory has none inside)
            if not listed:
                raise
            out += [_load(Path(r["path"])) for r in reversed(listed)]
    return out


def check_sides(base: Sequence[RunData], cand: Sequence[RunData]) -> None:
    """Refuse a run on both sides: compared with itself it can only look unchanged, which says nothing."""
    both = sorted({r.id for r in base} & {r.id for r in cand})
    if both:
        raise NotComparable(f"comparing a run with itself: run {', '.join(both)} is on both sides; allowed: "
                            "different runs on each side (repeats of one config are separate runs)")


def load_sides(base: Sequence[str], cand: Sequence[str], runs_dir: Path) -> tuple[list[RunData], list[RunData]]:
    """Both sides, checked against each other."""
    sides = load_side(base, runs_dir), load_side(cand, runs_dir)
    check_sides(*sides)
    return sides
