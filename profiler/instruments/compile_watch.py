"""CompileWatch: torch.compile recompiling during a run, as `recompile` events (events.jsonl).

A compiled run pays its compile time on the first step (flagged `warmup`, left out of summaries).
Every new input shape or guard failure later compiles again, inside a counted step: a run whose
batch size changes (dynamic batching) or whose shapes vary keeps paying it. Dynamo counts the
frames it compiles (`torch._dynamo.utils.counters["frames"]["total"]`, a dict read, no device
work); an increase after the first step is a recompile, recorded with the step it happened in.
"""

from __future__ import annotations

from typing import Any

from profiler.instruments.base import Instrument
from reference_model.hooks import StepRecord, TrainStart


def _frames() -> int:
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


class CompileWatch(Instrument):
    """Writes a `recompile` event for each step after the first in which dynamo compiled frames."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.first_step: int | None = None
        self.frames = 0
        self.recompiles = 0

    def on_train_start(self, start: TrainStart) -> None:
        self.first_step = start.start_step
        self.frames = _frames()

    def on_step_end(self, record: StepRecord) -> None:
        frames = _frames()
        if record.step != self.first_step and frames > self.frames:
            self.recompiles += frames - self.frames
            self.writer.add_event({"kind": "recompile", "step": record.step, "frames": frames - self.frames})
        self.frames = frames

    def summary(self) -> dict[str, Any]:
        return {"frames_compiled": self.frames, "recompiles": self.recompiles}
