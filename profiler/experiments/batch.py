"""Run a plan of configs one after another, in this process: what verify, sweep and tune share.

Each cell is an ordinary stored run (`profile_run`), linked to what it was made for through
run.json fields (`verifies`, `sweep`, `tune`). Cells of one process run warm: torch, the model
code and the data are loaded once, and the device's peaks come from their cache, so a cell costs
little beyond its training steps (docs/BENCHMARKS.md). Cells with several ranks go through
torchrun as any run does and pay its start-up.

A plan shows one progress bar over all its steps with the ETA. Ctrl-C stores the cell it stopped
(`interrupted`) and raises `BatchInterrupted`; every cell before it is kept, and callers keep their
record of them.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from profiler import store
from profiler.config import RunConfig
from reference_model.hooks import StepRecord, TrainerHook, TrainStart


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped a plan; the cells done so far are stored."""


@dataclass(frozen=True)
class Cell:
    """One run of a plan: what to run, how to call it on the progress line, what it links to."""

    label: str
    cfg: RunConfig
    links: Mapping[str, Any] = field(default_factory=dict)
    nproc: int = 1


def _libc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _libc_trim()


def release_memory() -> None:
    """Free what earlier cells left behind and hand it back to the OS. On CPU a run's peak is the
    process's RSS, and glibc keeps freed heap (its mmap threshold rises after large frees), so without
    malloc_trim the memory at a cell's start and its peak would include the cells before it."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


def traced_once(cfg: RunConfig, repeat: int) -> RunConfig:
    """The config of a repeat: the torch.profiler window only in the first. Its export and operator
    table cost seconds a run (docs/BENCHMARKS.md), and one traced run per config gives the
    operators that diagnosis and compare read; the window never changes what trains."""
    return cfg if repeat == 0 else replace(cfg, profile=replace(cfg.profile, trace=False))


class BatchProgress(TrainerHook):
    """Cell i/n, its label, and the plan's steps with the ETA: a live bar on a terminal, a plain line
    per cell (and every `every` steps) in logs. The ETA counts each cell's start and finish too."""

    def __init__(self, cells: Sequence[Cell], *, every: int = 25, stream: TextIO | None = None) -> None:
        self.total = sum(c.cfg.train.steps for c in cells)
        self.n = len(cells)
        self.every = every
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self._done = 0
        self._cell = (0, "")
        self._t0 = time.perf_counter()
        self._bar: Any = None
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[steps]}"),
                                 TimeRemainingColumn(), console=Console(file=self.stream))
            self._task = self._bar.add_task("", total=self.total, steps="")
            self._bar.start()

    def eta_s(self) -> float:
        elapsed = time.perf_counter() - self._t0
        return elapsed / self._done * (self.total - self._done) if self._done else float("nan")

    def start_cell(self, index: int, cell: Cell) -> None:
        self._cell = (index + 1, cell.label)
        self._line(f"cell {index + 1}/{self.n}: {cell.label}")

    def end_cell(self, cell: Cell, run_dir: Path, status: str) -> None:
        if cell.nproc > 1:  # its ranks ran in other processes: count its steps now
            self._done += cell.cfg.train.steps
        self._line(f"cell {self._cell[0]}/{self.n}: {self._cell[1]}: {status} ({run_dir.name})")

    def on_train_start(self, start: TrainStart) -> None:
        self._done += start.start_step

    def on_step_end(self, record: StepRecord) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done, description=f"cell {self._cell[0]}/{self.n} "
                             f"{self._cell[1]}", steps=f"{self._done}/{self.total} steps")
        elif self._done % self.every == 0:
            self._line(f"  {self._done}/{self.total} steps, eta {self.eta_s():.0f}s")

    def _line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def run_cells(cells: Sequence[Cell], *, runs_dir: Path, progress: bool = True) -> Iterator[tuple[Cell, Path]]:
    """Run the cells in order, yielding each with its stored run directory as it ends (also when the
    run failed: its record says why)."""
    from profiler.capture.run import profile_run  # torch and the trainer: only when cells run

    bar = BatchProgress(cells) if progress and cells else None
    try:
        for i, cell in enumerate(cells):
            if bar is not None:
                bar.start_cell(i, cell)
            release_memory()  # what the cell before left behind must not count in this one's memory
            hooks = (bar,) if bar is not None and cell.nproc == 1 else ()
            run_dir = profile_run(cell.cfg, runs_dir=runs_dir, nproc=cell.nproc, progress=False, hooks=hooks,
                                  links=dict(cell.links))
            status = store.read_run(run_dir)["status"]
            if bar is not None:
                bar.end_cell(cell, run_dir, status)
            yield cell, run_dir
            if status == "interrupted":
                raise BatchInterrupted(f"stopped during cell {i + 1} of {len(cells)} ({cell.label})")
    finally:
        if bar is not None:
            bar.close()
