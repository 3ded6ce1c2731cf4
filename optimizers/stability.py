"""Training stability: gradient clipping, the NaN/Inf guard, loss spike and plateau detection (000 4.4).

The source's guard (`if torch.isnan(loss): save_debug_checkpoint(); raise`) is kept as the
`stop` policy; `skip` drops only the bad step, which is what long runs usually want; `rollback`
recovers the run as large runs do after a divergence: back to the last good state (a host copy
taken every `rollback_every` steps, reference_model.rollback), the batches that led there skipped,
the learning rate scaled down, and on. All three decide before the update, so they read the loss
every step: one device sync per step, which stops the host from running ahead of the device. The
default is therefore `off`: the loss watch still reports a non-finite loss or gradient as an event,
read lazily once the device has produced it (a step or two late on CUDA, with its own step number),
and the diagnosis calls the run unstable. Spikes and plateaus are events too, not interventions,
unless `spike_policy=rollback` makes a spike roll back as well (the watch then runs at decision
time, on the values the guard read).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import ConfigError, Section
from optimizers.facts import Candidate
from optimizers.vocabulary import Bottleneck


@dataclass
class StabilityConfig(Section):
    KEY: ClassVar[str] = "switches.stability"
    clip_grad_norm: float = 1.0
    """Clip the global gradient L2 norm to this value (0 = no clipping; the norm is still measured)."""
    nan_guard: str = "off"
    """off (a NaN/Inf is recorded as an event, no sync); skip (drop the optimizer step when loss or
    gradients are NaN/Inf); stop (save a debug checkpoint with the batch and stop the run); rollback
    (return to the last good state, skip the batches since, scale the lr, continue). skip, stop and
    rollback read the loss every step: one device sync per step (two with several ranks under
    rollback: the ranks agree on the decision with an all-reduce)."""
    spike_factor: float = 3.0
    """A loss above this multiple of the running median is recorded as a spike event."""
    spike_policy: str = "event"
    """event (a spike is an event only); rollback (a spike also rolls back; needs nan_guard=rollback)."""
    rollback_every: int = 10
    """Steps between host copies of the last good state (model, optimizer, lr scheduler, GradScaler)
    under rollback; the start of the run is always one. Each copy waits for the device and moves the
    parameters and optimizer state to host memory: a larger value costs less and goes further back."""
    rollback_skip_batches: int = 0
    """Steps' worth of batches skipped after a rollback beyond those since the copy, which are skipped
    anyway; 0 because those are the ones that led to the divergence, more for data bad for a stretch."""
    rollback_lr_scale: float = 0.5
    """The lr (every param group and the schedule's base) is multiplied by this after each rollback:
    the same state and lr tend to diverge again on other batches; 1 skips the data only."""
    max_rollbacks: int = 5
    """Rollbacks before the run gives up with RollbackLimitError (at the default scale, the lr is 1/32
    by then: a run still diverging needs a lower train.lr, not more tries)."""
    window: int = 20
    """Steps in the running window for spike and plateau detection."""
    plateau_min_delta: float = 1e-4
    """A plateau event fires when the loss improved less than this over the window."""

    def __post_init__(self) -> None:
        self.check_range("clip_grad_norm", lo=0.0, hi=1e6)
        self.check_choice("nan_guard", ["off", "skip", "stop", "rollback"])
        self.check_range("spike_factor", lo=1.0, hi=1e6, lo_open=True)
        self.check_choice("spike_policy", ["event", "rollback"])
        if self.spike_policy == "rollback" and self.nan_guard != "rollback":
            raise ConfigError(self.key("spike_policy"), f"got 'rollback' with nan_guard={self.nan_guard!r}; "
                                                        "allowed: event (rollback needs nan_guard=rollback)")
        self.check_range("rollback_every", lo=1, hi=10**9)  # 0 would leave no state to return to
        self.check_range("rollback_skip_batches", lo=0, hi=10**6)
        self.check_range("rollback_lr_scale", lo=0.0, hi=1.0, lo_open=True)
        self.check_range("max_rollbacks", lo=1, hi=10**6)
        self.check_range("window", lo=2, hi=10**6)
        self.check_range("plateau_min_delta", lo=0.0, hi=1e6)


class LossWatch:
    """Flags a loss above `spike_factor` x the running median, a window without progress, and (when
    no guard does) the first step of each run of non-finite steps."""

    def __init__(self, cfg: StabilityConfig) -> None:
        self.cfg = cfg
        self.recent: deque[float] = deque(maxlen=cfg.window)
        self.plateau_reported_at = -1
        self.finite = True

    def observe(self, step: int, loss: float, grad_norm: float) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            if self.finite and self.cfg.nan_guard == "off":  # a guard reports its own
                events.append({"kind": "non_finite", "step": step, "loss": loss, "grad_norm": grad_norm,
                               "action": "none"})
            self.finite = False
            return events
        self.finite = True
        if len(self.recent) >= self.cfg.window // 2:
            median = statistics.median(self.recent)
            if median > 0 and loss > self.cfg.spike_factor * median:
                events.append({"kind": "loss_spike", "step": step, "loss": loss, "median": median,
                               "factor": loss / median, "grad_norm": grad_norm})
        if len(self.recent) == self.cfg.window and step - self.plateau_reported_at >= self.cfg.window:
            improvement = self.recent[0] - min(self.recent)
            if improvement < self.cfg.plateau_min_delta:
                events.append({"kind": "loss_plateau", "step": step, "loss": loss,
                               "improvement": improvement, "window": self.cfg.window})
                self.plateau_reported_at = step
        self.recent.append(loss)
        return events


def apply_stability(setup: TrainSetup, cfg: StabilityConfig, ctx: SetupContext) -> None:
    setup.clip_grad_norm = cfg.clip_grad_norm
    setup.nan_guard = cfg.nan_guard
    setup.monitors.append(LossWatch(cfg))
    clip = f"clip grad norm to {cfg.clip_grad_norm:g}" if cfg.clip_grad_norm else "no clipping"
    guard = cfg.nan_guard if cfg.nan_guard != "rollback" else (
        f"rollback (host copy every {cfg.rollback_every} steps, lr x{cfg.rollback_lr_scale:g} each, "
        f"at most {cfg.max_rollbacks}; spikes: {cfg.spike_policy})")
    setup.note("stability", f"{clip}; NaN/Inf guard {guard}; spike x{cfg.spike_factor:g}")


STABILITY = Optimization(
    name="stability", config=StabilityConfig, apply=apply_stability,
    enabled=lambda c: c != StabilityConfig(),
    addresses=(Bottleneck.UNSTABLE,),
    effect="clipping bounds the update after a bad batch; the guard keeps one NaN from ending a run; "
           "rollback recovers a diverging run",
    cost="skip/stop/rollback read the loss every step (one device sync: the host cannot run ahead of the "
         "device); rollback also copies model and optimizer state to the host every rollback_every steps; "
         "clipping one extra pass over grads",
    risk="clipping too low slows learning; skip can hide a real divergence (watch skipped steps); rollback "
         "changes the data seen and lowers the lr",
    source="000 4.4", always=True,
    candidates=(
        Candidate(set={"switches.stability.clip_grad_norm": 1.0}, applies=lambda c: c.clip_grad_norm == 0,
                  effects=(), risk="convergence", note="bounds the update after a bad batch"),
        Candidate(set={"switches.stability.nan_guard": "skip"}, applies=lambda c: c.nan_guard == "off",
                  effects=(), note="drops a step with a NaN/Inf loss or gradient instead of training on it; "
                                   "one device sync per step"),
        Candidate(set={"switches.stability.nan_guard": "rollback"}, applies=lambda c: c.nan_guard in ("off", "skip"),
                  effects=(), risk="convergence",
                  note="a diverging run goes back to its last good state, skips the batches that led there and "
                       "scales the lr by rollback_lr_scale; one device sync per step and a host copy of the state "
                       "every rollback_every steps"),
    ))
