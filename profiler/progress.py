"""The console view of a run: a live bar on a terminal, plain lines in logs (CI), rank 0 only."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from reference_model.trainer import StepRecord, Trainer, TrainerHook, TrainResult


class Progress(TrainerHook):
    """Step, loss, tokens/s and ETA. Reads the loss only every `every` steps (a device sync)."""

    def __init__(self, *, total_steps: int, every: int = 10, stream: TextIO | None = None) -> None:
        self.total, self.every = total_steps, every
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self._bar = None
        self._task = None
        self._t0 = 0.0
        self._tokens = 0
        self._start_step = 0

    def on_train_start(self, trainer: Trainer) -> None:
        self._t0 = time.perf_counter()
        self._start_step = trainer.start_step
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("[bold]step {task.completed}/{task.total}"), BarColumn(),
                                 TextColumn("{task.fields[status]}"), TimeRemainingColumn())
            self._task = self._bar.add_task("train", total=self.total, completed=trainer.start_step,
                                            status="")
            self._bar.start()

    def on_step_end(self, record: StepRecord) -> None:
        self._tokens += record.tokens
        done = record.step + 1
        if not (done % self.every == 0 or done == self.total or self.live):
            return
        elapsed = time.perf_counter() - self._t0
        rate = self._tokens / elapsed if elapsed > 0 else 0.0
        steps_done = done - self._start_step
        eta = elapsed / steps_done * (self.total - done) if steps_done else 0.0
        if self.live and self._bar is not None:
            status = f"loss {float(record.loss):.4f}  {rate:,.0f} tok/s" if done % self.every == 0 \
                or done == self.total or steps_done == 1 else None
            fields = {"status": status} if status else {}
            self._bar.update(self._task, completed=done, **fields)
        else:
            print(f"step {done}/{self.total}  loss {float(record.loss):.4f}  {rate:,.0f} tok/s  "
                  f"eta {eta:.0f}s", file=self.stream, flush=True)

    def on_train_end(self, result: TrainResult | None, error: BaseException | None) -> None:
        if self._bar is not None:
            self._bar.stop()
