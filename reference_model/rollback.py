"""The rollback guard (switches.stability.nan_guard=rollback): a diverging run goes back to its last
good state instead of skipping the step or stopping.

Large runs recover from a NaN or a loss spike by restarting from a state some steps back, skipping
the batches that led there and lowering the learning rate. Here the state (model, optimizer, lr
scheduler, GradScaler: this rank's part of each) is copied to host memory every `rollback_every`
good steps, so device memory does not double and nothing is written to disk; each copy waits for
the device. The step counter keeps going: the step that rolled back is recorded as skipped, and the
batches read since the copy are skipped by reading on. Kept apart so that the trainer stays one loop.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from optimizers.base import TrainSetup
from optimizers.stability import StabilityConfig
from reference_model.grads import local_part

REASONS = ("", "loss_spike", "non_finite")
"""Why a step rolls back ('' : it does not), in the order of the flag the ranks all-reduce with MAX:
the worst reason any rank saw is every rank's."""


class RollbackLimitError(RuntimeError):
    """The rollback guard gave up: the run still diverged after `max_rollbacks` rollbacks."""


def host_copy(value: Any) -> Any:
    """A tensor's local part (a DTensor's shard) copied to host memory; anything else deep-copied."""
    if isinstance(value, torch.Tensor):
        return local_part(value).detach().to("cpu", copy=True)
    return copy.deepcopy(value)


def reason(loss: float, grad_norm: float, events: Sequence[dict[str, Any]], *, check_norm: bool,
           spikes: bool) -> str:
    """Why this rank's step must roll back ('' if it need not): a non-finite loss, or grad norm when
    `check_norm` (a GradScaler handles inf gradients itself), else, when `spikes` roll back, a
    `loss_spike` among the loss watch's `events` for the step (optimizers.stability.LossWatch)."""
    if not math.isfinite(loss) or (check_norm and not math.isfinite(grad_norm)):
        return "non_finite"
    if spikes and any(e.get("kind") == "loss_spike" for e in events):
        return "loss_spike"
    return ""


def agreed(why: str, device: torch.device) -> str:
    """The worst of every rank's reason, so that all ranks roll back together (their collectives would
    part otherwise): one all-reduce, and one more read, when several ranks train."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return why
    flag = torch.tensor(REASONS.index(why), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return REASONS[int(flag)]


@dataclass
class Snapshot:
    """A good state in host memory."""

    step: int
    """The step training resumes at from it (the state after `step` updates)."""
    tensors: list[torch.Tensor]
    optimizer: dict[torch.Tensor, dict[str, Any]]
    lrs: list[float]
    scheduler: Any
    scaler: Any
    lr_scale: float
    """The cumulative lr scale in force when it was taken."""


class Rollback:
    """Decides before each update whether the step rolls back, copies good states and restores them."""

    def __init__(self, cfg: StabilityConfig, setup: TrainSetup, start_step: int, device: torch.device) -> None:
        assert setup.optimizer is not None, "apply_all builds the optimizer before the trainer runs"
        self.cfg, self.setup, self.optimizer, self.device = cfg, setup, setup.optimizer, device
        self.tensors = [*setup.raw_model.parameters(), *setup.raw_model.buffers()]
        self.rollbacks, self.lr_scale = 0, 1.0
        self.pending: dict[str, Any] | None = None
        self.snapshot = self._take(start_step)  # the start is a good state: a rollback always has one

    def check(self, step: int, loss: float, grad_norm: float, events: Sequence[dict[str, Any]]) -> bool:
        """Whether `step` rolls back (the same answer on every rank), from its loss and grad norm as read
        and the loss watch's events; raises RollbackLimitError when `max_rollbacks` are spent."""
        why = agreed(reason(loss, grad_norm, events, check_norm=self.setup.scaler is None,
                            spikes=self.cfg.spike_policy == "rollback"), self.device)
        if not why:
            return False
        if self.rollbacks >= self.cfg.max_rollbacks:
            raise RollbackLimitError(
                f"{why} at step {step} after {self.rollbacks} rollback(s), switches.stability.max_rollbacks="
                f"{self.cfg.max_rollbacks}: the run keeps diverging; lower train.lr or "
                "switches.stability.rollback_lr_scale, or raise max_rollbacks")
        self.pending = {"kind": "rollback", "step": step, "to_step": self.snapshot.step, "reason": why,
                        "loss": loss, "grad_norm": grad_norm}
        return True

    def due(self, step: int, skipped: bool) -> bool:
        """Whether the end of `step` has work: a rollback was decided, or a good step's copy is due."""
        return self.pending is not None or (not skipped and (step + 1) % self.cfg.rollback_every == 0)

    def settle(self, step: int, batches: Iterator[dict[str, torch.Tensor]]) -> dict[str, Any] | None:
        """At the end of a step `due` named: roll back (its event returned), or copy the good state."""
        if self.pending is None:
            self.snapshot = self._take(step + 1)
            return None
        event, self.pending = self.pending, None
        self.rollbacks += 1
        self.lr_scale *= self.cfg.rollback_lr_scale
        self._restore(self.snapshot)
        for _ in range(self.cfg.rollback_skip_batches * self.setup.accumulation_steps):
            next(batches)
        return {**event, "skipped_batches": step + 1 - self.snapshot.step + self.cfg.rollback_skip_batches,
                "lr_scale": self.lr_scale, "rollbacks": self.rollbacks}

    def _take(self, step: int) -> Snapshot:
        s = self.setup
        return Snapshot(
            step=step, tensors=[host_copy(t) for t in self.tensors],
            optimizer={p: {k: host_copy(v) for k, v in state.items()} for p, state in self.optimizer.state.items()},
            lrs=[group["lr"] for group in self.optimizer.param_groups],
            scheduler=host_copy(s.scheduler.state_dict()) if s.scheduler is not None else None,
            scaler=s.scaler.state_dict() if s.scaler is not None else None, lr_scale=self.lr_scale)

    @torch.no_grad()
    def _restore(self, snap: Snapshot) -> None:
        """Back to `snap`, the lr (param groups and the schedule's base) at the scale now in force."""
        s = self.setup
        for tensor, saved in zip(self.tensors, snap.tensors, strict=True):
            local_part(tensor).copy_(saved)
        self._restore_optimizer(snap.optimizer)
        if s.scaler is not None:
            s.scaler.load_state_dict(snap.scaler)
        factor = self.lr_scale / snap.lr_scale
        if s.scheduler is not None:  # before the lrs: loading may set them (optimizers.optim.WarmupPlateau)
            s.scheduler.load_state_dict(host_copy(snap.scheduler))
            s.scheduler.base_lrs = [lr * factor for lr in s.scheduler.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, snap.lrs, strict=True):
            group["lr"] = lr * factor

    def _restore_optimizer(self, saved: dict[torch.Tensor, dict[str, Any]]) -> None:
        """The optimizer's state as saved, in place (its tensors keep their device and layout); state
        made since (the first steps') is dropped, as the optimizer had none then."""
        state = self.optimizer.state
        for param in [p for p in state if p not in saved]:
            del state[param]
        for param, entries in saved.items():
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    local_part(state[param][key]).copy_(value)
                else:
                    state[param][key] = copy.deepcopy(value)
