"""The torch optimizer and the learning-rate schedule (000 4.1; 004 4.3).

The schedule is a pure function of the optimizer step (`lr_factor`), so a test can compare the
learning rate at every step with the formula and a resumed run continues the same curve. The
plateau schedule needs the loss, which costs a device sync per step; the others do not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from optimizers.base import Optimization, SetupContext, Switches, TrainSetup
from optimizers.config import Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class OptimizerConfig(Section):
    KEY: ClassVar[str] = "switches.optimizer"
    name: str = "adamw"
    """adamw, sgd (with momentum), rmsprop, adagrad."""
    impl: str = "auto"
    """auto (torch's default), forloop, foreach (multi-tensor), fused (where torch has it)."""
    weight_decay: float = 0.1
    """Decoupled for adamw; L2 for the others. Not applied to norms and biases."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9
    """sgd and rmsprop only."""

    def __post_init__(self) -> None:
        self.check_choice("name", ["adamw", "sgd", "rmsprop", "adagrad"])
        self.check_choice("impl", ["auto", "forloop", "foreach", "fused"])
        self.check_range("weight_decay", lo=0.0, hi=10.0)
        self.check_range("beta1", lo=0.0, hi=1.0, hi_open=True)
        self.check_range("beta2", lo=0.0, hi=1.0, hi_open=True)
        self.check_range("eps", lo=0.0, hi=1.0, lo_open=True)
        self.check_range("momentum", lo=0.0, hi=1.0, hi_open=True)


@dataclass
class LrScheduleConfig(Section):
    KEY: ClassVar[str] = "switches.lr_schedule"
    name: str = "cosine"
    """constant, cosine (to min_lr_ratio * lr at the last step), step (x gamma every step_size),
    plateau (x factor when the loss stalls for patience steps)."""
    warmup_steps: int = 10
    """Linear warmup from lr/warmup_steps to lr over the first N optimizer steps (0 = none)."""
    min_lr_ratio: float = 0.1
    step_size: int = 100
    gamma: float = 0.5
    plateau_patience: int = 10
    plateau_factor: float = 0.5

    def __post_init__(self) -> None:
        self.check_choice("name", ["constant", "cosine", "step", "plateau"])
        self.check_range("warmup_steps", lo=0, hi=10**9)
        self.check_range("min_lr_ratio", lo=0.0, hi=1.0)
        self.check_range("step_size", lo=1, hi=10**9)
        self.check_range("gamma", lo=0.0, hi=1.0, lo_open=True)
        self.check_range("plateau_patience", lo=1, hi=10**9)
        self.check_range("plateau_factor", lo=0.0, hi=1.0, lo_open=True, hi_open=True)

_CLASSES = {"adamw": "AdamW", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad"}
"""The optimizers by name: their classes in torch.optim."""
# torch offers a fused (single-kernel) implementation only for these.
_FUSED = {"adamw", "sgd", "adagrad"}


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices only: norms and biases (1-D) are not decayed, as in GPT/GLM training."""
    seen: set[int] = set()
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig, lr: float) -> torch.optim.Optimizer:
    import torch

    kwargs: dict[str, Any] = {"lr": lr}
    if cfg.name == "adamw":
        kwargs.update(betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    elif cfg.name in ("sgd", "rmsprop"):
        kwargs.update(momentum=cfg.momentum)
    if cfg.name in ("rmsprop", "adagrad"):
        kwargs.update(eps=cfg.eps)
    if cfg.impl == "forloop":
        kwargs["foreach"] = False
    elif cfg.impl == "foreach":
        kwargs["foreach"] = True
    elif cfg.impl == "fused":
        kwargs["fused"] = True
    optimizer_class: type[torch.optim.Optimizer] = getattr(torch.optim, _CLASSES[cfg.name])
    return optimizer_class(param_groups(model, cfg.weight_decay), **kwargs)


def lr_factor(cfg: LrScheduleConfig, step: int, total_steps: int) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based), for every schedule but plateau.

    warmup: (step + 1) / warmup_steps for the first warmup_steps steps, then
    constant: 1; cosine: min + (1 - min) * (1 + cos(pi * progress)) / 2, progress 0 -> 1 over the
    remaining steps; step: gamma ** ((step - warmup) // step_size).
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    after = step - cfg.warmup_steps
    if cfg.name == "cosine":
        span = max(1, total_steps - cfg.warmup_steps - 1)
        progress = min(1.0, after / span)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if cfg.name == "step":
        return cfg.gamma ** (after // cfg.step_size)
    return 1.0


class WarmupPlateau:
    """Linear warmup, then multiply the lr by `factor` when the loss has not improved for `patience`."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: LrScheduleConfig) -> None:
        self.optimizer, self.cfg = optimizer, cfg
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.step_count, self.scale, self.best, self.bad_steps = 0, 1.0, math.inf, 0
        self._set()

    def _set(self) -> None:
        warm = min(1.0, (self.step_count + 1) / self.cfg.warmup_steps) if self.cfg.warmup_steps else 1.0
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * warm * self.scale

    def step(self, loss: float | None) -> None:
        self.step_count += 1
        if loss is not None and self.step_count > self.cfg.warmup_steps:
            if loss < self.best - 1e-12:
                self.best, self.bad_steps = loss, 0
            else:
                self.bad_steps += 1
                if self.bad_steps >= self.cfg.plateau_patience:
                    self.scale *= self.cfg.plateau_factor
                    self.bad_steps = 0
        self._set()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("base_lrs", "step_count", "scale", "best", "bad_steps")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        self._set()


def apply_optimizer(setup: TrainSetup, cfg: OptimizerConfig, ctx: SetupContext) -> None:
    setup.optimizer = build_optimizer(setup.raw_model, cfg, ctx.lr)
    setup.note("optimizer", f"{cfg.name} (impl {cfg.impl}, lr {ctx.lr:g}, weight decay {cfg.weight_decay:g})")


def apply_lr_schedule(setup: TrainSetup, cfg: LrScheduleConfig, ctx: SetupContext) -> None:
    import torch

    if setup.optimizer is None:
        raise RuntimeError("lr_schedule needs the optimizer: apply 'optimizer' first")
    if cfg.name == "plateau":
        setup.scheduler, setup.scheduler_wants_loss = WarmupPlateau(setup.optimizer, cfg), True
    else:
        total = ctx.total_steps
        setup.scheduler = torch.optim.lr_scheduler.LambdaLR(
            setup.optimizer, lambda step: lr_factor(cfg, step, total))
    setup.note("lr_schedule", f"{cfg.name}, warmup {cfg.warmup_steps} steps")


def _check_fused(switches: Switches, ctx: SetupContext) -> str | None:
    cfg = switches.optimizer
    if cfg.impl == "fused" and cfg.name not in _FUSED:
        return f"impl=fused: torch has no fused {cfg.name}; fused exists for {', '.join(sorted(_FUSED))}"
    return None


OPTIMIZER = Optimization(
    name="optimizer", config=OptimizerConfig, apply=apply_optimizer,
    enabled=lambda c: c.name != "adamw" or c.impl != "auto",
    addresses=(Bottleneck.OPTIMIZER_BOUND,),
    effect="foreach/fused implementations cut the optimizer step's kernel launches from one per "
           "parameter to a few",
    cost="fused AdamW keeps the same state; sgd/rmsprop/adagrad change convergence, not only speed",
    risk="a different optimizer needs its own lr; compare loss curves, not only step time",
    source="000 4.1; 004 4.3", checks=(_check_fused,), always=True,
    # fused only: foreach measured -1% of the optimizer phase on CPU (optimizer impl=foreach row), and
    # on CUDA `auto` already picks foreach
    candidates=(
        Candidate(set={"switches.optimizer.impl": "fused"},
                  applies=lambda c: c.name in _FUSED and c.impl != "fused",
                  effects=(Effect("optimizer", "shrinks", 0.3, 0.6,
                                  basis="optimizer impl=fused row: optimizer phase -45% vs the for-loop"),)),
    ))

LR_SCHEDULE = Optimization(
    name="lr_schedule", config=LrScheduleConfig, apply=apply_lr_schedule, enabled=lambda c: c.name != "cosine",
    addresses=(Bottleneck.UNSTABLE,),
    effect="warmup avoids early loss spikes; decay lowers the final loss",
    cost="none per step (plateau reads the loss every step: one device sync)",
    risk="too short a warmup or too high a peak lr diverges", source="000 4.1; 004 4.3", always=True,
    candidates=(
        Candidate(set={"switches.lr_schedule.warmup_steps": lambda warmup: max(2 * warmup, 10)}, effects=(),
                  risk="convergence", note="early loss spikes: a longer warmup; no effect on step time"),
    ))
