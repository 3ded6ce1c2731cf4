"""Training stability: gradient clipping, the NaN/Inf guard, loss spike and plateau detection (000 4.4).

The source's guard (`if torch.isnan(loss): save_debug_checkpoint(); raise`) is kept as the
`stop` policy; `skip` drops only the bad step, which is what long runs usually want. Spikes and
plateaus are events, not interventions: the run records them and the diagnosis reads them.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import StabilityConfig


class LossWatch:
    """Flags a loss above `spike_factor` x the running median, and a window without progress."""

    def __init__(self, cfg: StabilityConfig) -> None:
        self.cfg = cfg
        self.recent: deque[float] = deque(maxlen=cfg.window)
        self.plateau_reported_at = -1

    def observe(self, step: int, loss: float, grad_norm: float) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if loss != loss or loss in (float("inf"), float("-inf")):
            return events  # the NaN guard reports these
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
    name="stability", apply=apply_stability,
    enabled=lambda c: c != StabilityConfig(),
    addresses=("unstable",),
    effect="clipping bounds the update after a bad batch; the guard keeps one NaN from ending a run",
    cost="the guard reads the loss every step (one device sync); clipping one extra pass over grads",
    risk="clipping too low slows learning; skip can hide a real divergence (watch skipped steps)",
    source="000 4.4")
