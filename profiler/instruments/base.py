"""The instrument protocol: what an instrument receives, and the two methods it adds to a hook.

An instrument is a `reference_model.hooks.TrainerHook` (every method passes through, so it
overrides only what it needs: Lightning's `profilers/profiler.py` shape) that can also summarize
itself and release what it holds. It never looks into the trainer; all it receives is:

- `on_train_start(start: TrainStart)`: device, rank, world size, first and last step.
- `on_step_start(step)`, then pairs of `on_phase_start(step, phase)` / `on_phase_end(step, phase)`
  (a phase may repeat within a step: one data/h2d/forward/backward per micro-batch; phase names
  are profiler.metrics.PHASES, any other name counts as `other`).
- `on_step_end(record: StepRecord)`: the step's tokens, batch, lr, flags, and its loss and grad
  norm as device tensors plus `record.scalars()` (readable without a device sync once `ready()`).
- `on_event(event)` for switch events, and `on_train_end(result, error)` once, also after a failure.

Anything else an instrument needs (the run writer, the communication counters, which steps the
torch.profiler window covers) it is given when built. So the reference trainer, a user's own loop
(`with run.step(): ...`) and an imported trace feed the same instruments and the same tables.
Instruments write rows to the run store's writer; `summary()` keeps only facts about the instrument
(what it measured with, errors), since analysis reads the stored rows.
"""

from __future__ import annotations

from typing import Any

from reference_model.hooks import TrainerHook


class Instrument(TrainerHook):
    """A `TrainerHook` with a small `summary()` for run.json and a `close()` for threads and files."""

    def summary(self) -> dict[str, Any]:
        """Facts about the instrument itself (what it measured with, errors); {} by default."""
        return {}

    def close(self) -> None:
        """Release threads, files or profiler state; safe to call twice, and after a failed run."""
