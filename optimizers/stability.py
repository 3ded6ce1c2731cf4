"""Training stability: gradient clipping, the NaN/Inf guard, loss spike and plateau detection (000 4.4).

The source's guard (`if torch.isnan(loss): save_debug_checkpoint(); raise`) is kept as the
`stop` policy; `skip` drops only the bad step, which is what long runs usually want. Both must
decide before the update, so they read the loss every step: one device sync per step, which stops
the host from running ahead of the device. The default is therefore `off`: the loss watch still
reports a non-finite loss or gradient as an event, read lazily once the device has produced it
(a step or two late on CUDA, with its own step number), and the diagnosis calls the run unstable.
Spikes and plateaus are events too, not interventions.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import Section
from optimizers.facts import Candidate
from optimizers.vocabulary import Bottleneck


@dataclass
class StabilityConfig(Section):
    KEY: ClassVar[str] = "switches.stability"
    clip_grad_norm: float = 1.0
    """Clip the global gradient L2 norm to this value (0 = no clipping; the norm is still measured)."""
    nan_guard: str = "off"
    """off (a NaN/Inf is recorded as an event, no sync); skip (drop the optimizer step when loss or
    gradients are NaN/Inf); stop (save a debug checkpoint with the batch and stop the run). skip and
    stop read the loss every step: one device sync per step."""
    spike_factor: float = 3.0
    """A loss above this multiple of the running median is recorded as a spike event."""
    window: int = 20
    """Steps in the running window for spike and plateau detection."""
    plateau_min_delta: float = 1e-4
    """A plateau event fires when the loss improved less than this over the window."""

    def __post_init__(self) -> None:
        self.check_range("clip_grad_norm", lo=0.0, hi=1e6)
        self.check_choice("nan_guard", ["off", "skip", "stop"])
        self.check_range("spike_factor", lo=1.0, hi=1e6, lo_open=True)
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
    setup.note("stability", f"{clip}; NaN/Inf guard {cfg.nan_guard}; spike x{cfg.spike_factor:g}")


STABILITY = Optimization(
    name="stability", config=StabilityConfig, apply=apply_stability,
    enabled=lambda c: c != StabilityConfig(),
    addresses=(Bottleneck.UNSTABLE,),
    effect="clipping bounds the update after a bad batch; the guard keeps one NaN from ending a run",
    cost="skip/stop read the loss every step (one device sync: the host cannot run ahead of the device); "
         "clipping one extra pass over grads",
    risk="clipping too low slows learning; skip can hide a real divergence (watch skipped steps)",
    source="000 4.4", always=True,
    candidates=(
        Candidate(set={"switches.stability.clip_grad_norm": 1.0}, applies=lambda c: c.clip_grad_norm == 0,
                  effects=(), risk="convergence", note="bounds the update after a bad batch"),
        Candidate(set={"switches.stability.nan_guard": "skip"}, applies=lambda c: c.nan_guard == "off",
                  effects=(), note="drops a step with a NaN/Inf loss or gradient instead of training on it; "
                                   "one device sync per step"),
    ))
