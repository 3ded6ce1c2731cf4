"""The console view of a run: a live bar on a terminal, plain lines in logs (CI), rank 0 only.

The loss it shows is the newest one the device has already produced (`record.scalars().ready()`):
the progress line never makes the host wait for the device.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

from reference_model.hooks import StepRecord, TrainerHook, TrainResult, TrainStart

if TYPE_CHECKING:
    from rich import progress as rich_progress


class Progress(TrainerHook):
    """Step, loss, tokens/s and ETA: every step on a terminal, every `every` steps otherwise."""

    def __init__(self, *, total_steps: int, every: int = 10, stream: TextIO | None = None) -> None:
        self.total, self.every = total_steps, every
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self._bar: tuple[rich_progress.Progress, rich_progress.TaskID] | None = None
        """The live bar and its task, on a terminal once the run started."""
        self._t0 = 0.0
        self._tokens = 0
        self._start_step = 0
        self._loss: tuple[int, float] | None = None
        """(step, loss) of the newest step whose loss has reached the host."""

    def on_train_start(self, start: TrainStart) -> None:
        self._t0 = time.perf_counter()
        self._start_step = start.start_step
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            bar = Progress(TextColumn("[bold]step {task.completed}/{task.total}"), BarColumn(),
                           TextColumn("{task.fields[status]}"), TimeRemainingColumn())
            self._bar = (bar, bar.add_task("train", total=self.total, completed=start.start_step, status=""))
            bar.start()

    def _status(self, current: int, rate: float) -> str:
        if self._loss is None:
            return f"{rate:,.0f} tok/s"
        step, loss = self._loss
        late = "" if step == current else f" (step {step + 1})"
        return f"loss {loss:.4f}{late}  {rate:,.0f} tok/s"

    def on_step_end(self, record: StepRecord) -> None:
        self._tokens += record.tokens
        if record.scalars().ready():
            self._loss = (record.step, record.scalars().values()[0])
        done = record.step + 1
        if not (done % self.every == 0 or done == self.total or self.live):
            return
        elapsed = time.perf_counter() - self._t0
        rate = self._tokens / elapsed if elapsed > 0 else 0.0
        steps_done = done - self._start_step
        eta = elapsed / steps_done * (self.total - done) if steps_done else 0.0
        status = self._status(record.step, rate)
        if self.live and self._bar is not None:
            bar, task = self._bar
            bar.update(task, completed=done, status=status)
        else:
            print(f"step {done}/{self.total}  {status}  eta {eta:.0f}s", file=self.stream, flush=True)

    def on_train_end(self, result: TrainResult | None, error: BaseException | None) -> None:
        if self._bar is not None:
            self._bar[0].stop()
