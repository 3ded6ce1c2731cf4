"""The hook protocol: what the trainer tells an instrument, and when.

`TrainerHook` is the pass-through base every instrument extends; `TrainStart`, `StepRecord` and
`TrainResult` are what its calls carry. It lives apart from the trainer so that instruments and
integrations depend on the protocol, not on the loop that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from reference_model.lazy import LazyScalars


@dataclass
class StepRecord:
    """One optimizer step's figures, as the trainer knows them (timings belong to instruments)."""

    step: int
    batch_size: int
    """Micro-batch size in samples (per rank)."""
    micro_batches: int
    tokens: int
    """Input tokens this rank processed in the step: its share of its data-parallel replica's batch
    when several ranks (tensor-parallel or pipeline) work on one batch, so the ranks' sum counts
    every token once."""
    loss: torch.Tensor
    """Mean loss over the micro-batches (a detached device tensor: reading it is a device sync)."""
    grad_norm: torch.Tensor
    """Global gradient L2 norm before clipping (a detached device tensor)."""
    lr: float
    loss_scale: float | None
    skipped: bool
    wall_s: float
    """Host wall time of the step, from step start to the end of the optimizer phase."""
    warmup: bool = False
    """True for steps that include one-off work (compilation)."""
    values: LazyScalars | None = None
    """(loss, grad norm) on their way to the host: `ready()` never blocks, `values()` gives floats."""

    def scalars(self) -> LazyScalars:
        """The lazy (loss, grad norm) pair, made on first use for a record built without one."""
        if self.values is None:
            self.values = LazyScalars(torch.as_tensor(self.loss), torch.as_tensor(self.grad_norm))
        return self.values


@dataclass(frozen=True)
class TrainStart:
    """What a hook learns when training starts: where it runs and which steps it will see."""

    device: torch.device
    rank: int
    world_size: int
    start_step: int
    """First step this process runs (after a resume, the step it resumed at)."""
    total_steps: int
    """The step count the run ends at (steps run here: total_steps - start_step)."""


@dataclass
class TrainResult:
    steps: int
    """Optimizer steps completed in this process (resumed steps not counted)."""
    final_step: int
    elapsed_s: float = 0.0


class TrainerHook:
    """Pass-through base: instruments override what they need.

    Calls, in order: `on_train_start(TrainStart)` once; per step `on_step_start(step)`, pairs of
    `on_phase_start/on_phase_end(step, phase)` (phases may repeat within a step: one data/h2d/
    forward/backward per micro-batch), `on_step_end(StepRecord)`; `on_event(dict)` whenever a
    switch reports one; `on_train_end(result or None, error or None)` once, also after a failure.
    """

    def on_train_start(self, start: TrainStart) -> None: ...
    def on_step_start(self, step: int) -> None: ...
    def on_phase_start(self, step: int, phase: str) -> None: ...
    def on_phase_end(self, step: int, phase: str) -> None: ...
    def on_step_end(self, record: StepRecord) -> None: ...
    def on_event(self, event: dict[str, Any]) -> None: ...
    def on_train_end(self, result: TrainResult | None, error: BaseException | None) -> None: ...
