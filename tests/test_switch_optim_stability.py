"""Optimizer and schedule (the lr follows the formula) and stability (NaN guard, clipping, events)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from optimizers import SwitchesConfig
from optimizers.config import build_section
from optimizers.optim import LrScheduleConfig, OptimizerConfig, build_optimizer, lr_factor
from optimizers.stability import LossWatch, StabilityConfig
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.model import GLMForCausalLM
from reference_model.trainer import NonFiniteLossError, Trainer


class Collect(TrainerHook):
    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.events: list[dict] = []

    def on_step_end(self, record: StepRecord) -> None:
        self.records.append(record)

    def on_event(self, event: dict) -> None:
        self.events.append(event)


def trainer(tmp_path: Path, switches: dict, *, steps: int = 12, lr: float = 1e-2, hooks=()) -> Trainer:
    return Trainer(model_cfg=model_config("tiny"), data_cfg=DataConfig(corpus=["synthetic"], seq_len=16),
                   train_cfg=TrainConfig(batch_size=2, steps=steps, device="cpu", lr=lr),
                   switches=build_section(SwitchesConfig, switches, "switches"), hooks=hooks, run_dir=tmp_path)


def expected_lr(name: str, step: int, total: int, lr: float) -> float:
    """The schedules written out independently of optimizers.optim (warmup 3, cosine to 10%)."""
    if step < 3:
        return lr * (step + 1) / 3
    if name == "constant":
        return lr
    if name == "cosine":
        progress = (step - 3) / (total - 3 - 1)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
    return lr * 0.5 ** ((step - 3) // 4)  # step


@pytest.mark.parametrize("name", ["constant", "cosine", "step"])
def test_the_lr_of_every_step_follows_the_schedule(tmp_path: Path, name: str) -> None:
    hook = Collect()
    trainer(tmp_path, {"lr_schedule": {"name": name, "warmup_steps": 3, "step_size": 4, "gamma": 0.5}},
            hooks=[hook]).fit()
    for r in hook.records:
        assert r.lr == pytest.approx(expected_lr(name, r.step, 12, 1e-2), rel=1e-12), r.step


def test_lr_factor_ends_cosine_at_the_floor() -> None:
    cfg = LrScheduleConfig(name="cosine", warmup_steps=0, min_lr_ratio=0.2)
    assert lr_factor(cfg, 0, 50) == pytest.approx(1.0)
    assert lr_factor(cfg, 49, 50) == pytest.approx(0.2)


def test_plateau_cuts_the_lr_when_the_loss_stalls(tmp_path: Path) -> None:
    hook = Collect()
    # lr so small the loss cannot improve much: the plateau schedule must cut it
    trainer(tmp_path, {"lr_schedule": {"name": "plateau", "warmup_steps": 0, "plateau_patience": 2,
                                       "plateau_factor": 0.5}}, lr=1e-9, steps=12, hooks=[hook]).fit()
    assert hook.records[-1].lr < 1e-9


@pytest.mark.parametrize(("name", "impl", "cls"), [("adamw", "fused", torch.optim.AdamW),
                                                   ("sgd", "foreach", torch.optim.SGD),
                                                   ("rmsprop", "forloop", torch.optim.RMSprop),
                                                   ("adagrad", "fused", torch.optim.Adagrad)])
def test_optimizer_choice_and_implementation(name: str, impl: str, cls: type) -> None:
    model = GLMForCausalLM(model_config("tiny"))
    opt = build_optimizer(model, OptimizerConfig(name=name, impl=impl), lr=1e-3)
    assert type(opt) is cls
    flag = {"fused": "fused", "foreach": "foreach", "forloop": "foreach"}[impl]
    assert opt.defaults[flag] is (impl != "forloop")
    decayed, plain = opt.param_groups
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in plain["params"])
    assert plain["weight_decay"] == 0.0


class PoisonAt(TrainerHook):
    """Multiplies the model's last norm's output by `factor` in one step (a forward hook): NaN makes the
    step's loss NaN, a large factor makes it spike."""

    def __init__(self, trainer_: Trainer, step: int, factor: float = float("nan")) -> None:
        self.step, self.factor = step, factor
        trainer_.model.model.norm.register_forward_hook(self._hook)
        self.current = -1

    def on_step_start(self, step: int) -> None:
        self.current = step

    def _hook(self, module, args, output):
        return output * self.factor if self.current == self.step else output


class Snapshots(TrainerHook):
    """The model's weights at the start of every step."""

    def __init__(self, trainer_: Trainer) -> None:
        self.model, self.at = trainer_.model, {}

    def on_step_start(self, step: int) -> None:
        self.at[step] = [p.detach().clone() for p in self.model.parameters()]


def test_an_injected_nan_is_skipped_and_recorded(tmp_path: Path) -> None:
    hook = Collect()
    t = trainer(tmp_path, {"stability": {"nan_guard": "skip"}}, steps=5, hooks=[hook])
    snaps = Snapshots(t)
    t.hooks[:0] = [PoisonAt(t, 2), snaps]
    t.fit()
    assert [r.skipped for r in hook.records] == [False, False, True, False, False]
    assert [e["kind"] for e in hook.events if e["kind"] == "non_finite"] == ["non_finite"]
    assert all(torch.equal(a, b) for a, b in zip(snaps.at[2], snaps.at[3], strict=True))  # step 2 left them
    assert not all(torch.equal(a, b) for a, b in zip(snaps.at[3], snaps.at[4], strict=True))  # step 3 did not
    assert all(torch.isfinite(p).all() for p in t.model.parameters())


def test_without_a_guard_a_nan_is_an_event_read_lazily(tmp_path: Path) -> None:
    hook = Collect()
    t = trainer(tmp_path, {}, steps=5, hooks=[hook])
    assert t.setup.nan_guard == "off"  # the default: no device sync per step
    t.hooks.insert(0, PoisonAt(t, 2))
    t.fit()
    (event,) = [e for e in hook.events if e["kind"] == "non_finite"]  # once, not once per NaN step after it
    assert event["step"] == 2 and event["action"] == "none" and event["loss"] != event["loss"]
    assert not any(r.skipped for r in hook.records)


def test_the_stop_policy_saves_a_debug_checkpoint_with_the_batch(tmp_path: Path) -> None:
    hook = Collect()
    t = trainer(tmp_path, {"stability": {"nan_guard": "stop"}}, steps=5, hooks=[hook])
    t.hooks.insert(0, PoisonAt(t, 1))
    with pytest.raises(NonFiniteLossError):
        t.fit()
    (event,) = [e for e in hook.events if e["kind"] == "non_finite"]
    state = torch.load(event["debug_checkpoint"], weights_only=True)
    assert state["step"] == 1 and state["batch"]["input_ids"].shape == (2, 16)


def test_clipping_caps_the_gradient_norm(tmp_path: Path) -> None:
    clipped: list[float] = []

    class AfterClip(TrainerHook):
        def on_phase_end(self, step: int, phase: str) -> None:
            if phase == "optimizer":
                grads = [p.grad for p in t.model.parameters() if p.grad is not None]
                clipped.append(float(torch.nn.utils.get_total_norm(grads)))

    hook = Collect()
    t = trainer(tmp_path, {"stability": {"clip_grad_norm": 0.01}}, steps=3, hooks=[hook, AfterClip()])
    t.fit()
    assert all(float(r.grad_norm) > 0.01 for r in hook.records)  # the norm before clipping is recorded
    assert all(n == pytest.approx(0.01, rel=1e-4) for n in clipped)


def test_spikes_and_plateaus_become_events() -> None:
    watch = LossWatch(StabilityConfig(window=10, spike_factor=3.0, plateau_min_delta=1e-3))
    events = [e for step in range(10) for e in watch.observe(step, 2.0, 1.0)]
    assert [e["kind"] for e in events] == []
    assert [e["kind"] for e in watch.observe(10, 7.0, 50.0)] == ["loss_spike", "loss_plateau"]
    assert [e["kind"] for e in watch.observe(11, float("nan"), 1.0)] == ["non_finite"]  # no guard: the watch says
    assert watch.observe(12, float("nan"), 1.0) == []  # once per run of non-finite steps
    guarded = LossWatch(StabilityConfig(nan_guard="skip"))
    assert guarded.observe(0, float("nan"), 1.0) == []  # the guard reports its own
