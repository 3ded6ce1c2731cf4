"""amp: autocast really runs the matmuls in half precision, trains like fp32, and fp16 skips inf steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from optimizers import SwitchesConfig
from optimizers.amp import OPTIMIZATION, AmpConfig, apply_amp
from optimizers.base import TrainSetup
from optimizers.config import build_section
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.model import GLMForCausalLM
from reference_model.trainer import Trainer
from tests.contexts import context

# constant lr, no warmup: the loss moves enough in a few steps for the comparison to mean something
_FAST = {"lr_schedule": {"name": "constant", "warmup_steps": 0}}


class Records(TrainerHook):
    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def on_step_end(self, record: StepRecord) -> None:
        self.records.append(record)


def make_trainer(tmp_path: Path, switches: dict, *, steps: int, hooks=(),
                 corpus: str = "synthetic") -> Trainer:
    return Trainer(model_cfg=model_config("tiny"), data_cfg=DataConfig(corpus=[corpus], seq_len=32),
                   train_cfg=TrainConfig(batch_size=4, steps=steps, device="cpu", lr=3e-3),
                   switches=build_section(SwitchesConfig, {**_FAST, **switches}, "switches"),
                   hooks=hooks, run_dir=tmp_path)


@pytest.mark.parametrize(("name", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_matmuls_inside_the_step_run_in_the_amp_dtype(tmp_path: Path, name: str, dtype: torch.dtype) -> None:
    trainer = make_trainer(tmp_path, {"amp": name}, steps=1)
    seen: dict[str, torch.dtype] = {}
    modules = {"down_proj": trainer.model.blocks[0].mlp.down_proj, "lm_head": trainer.model.lm_head}
    for label, module in modules.items():
        module.register_forward_hook(lambda m, args, out, label=label: seen.__setitem__(label, out.dtype))
    trainer.fit()
    assert seen == {"down_proj": dtype, "lm_head": dtype}
    # autocast casts per operator: the weights the optimizer updates stay fp32
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert (trainer.setup.scaler is not None) == (name == "fp16")


def test_losses_track_fp32_within_tolerance(tmp_path: Path) -> None:
    losses = {}
    for name in ("off", "bf16", "fp16"):
        hook = Records()
        # real text (random tokens teach nothing), so the loss falls and the curves are worth comparing
        make_trainer(tmp_path / name, {"amp": name}, steps=5, hooks=[hook], corpus="stdlib").fit()
        losses[name] = torch.tensor([float(r.loss) for r in hook.records])
    assert losses["off"][-1] < losses["off"][0] - 0.5
    # bf16 keeps 8 mantissa bits, fp16 11; measured: within 2e-4 (bf16) and 6e-5 (fp16) relative
    torch.testing.assert_close(losses["bf16"], losses["off"], rtol=5e-3, atol=0)
    torch.testing.assert_close(losses["fp16"], losses["off"], rtol=1e-3, atol=0)


class InfOnStep(TrainerHook):
    """Puts an inf into one gradient after backward of step `bad`, and snapshots weights around steps."""

    def __init__(self, bad: int) -> None:
        self.bad = bad
        self.records: list[StepRecord] = []
        self.changed: dict[int, bool] = {}

    def on_step_start(self, step: int) -> None:
        self.before = [p.detach().clone() for p in self.trainer.model.parameters()]

    def on_phase_end(self, step: int, phase: str) -> None:
        if phase == "backward" and step == self.bad:
            self.trainer.model.lm_head.weight.grad[0, 0] = float("inf")

    def on_step_end(self, record: StepRecord) -> None:
        after = list(self.trainer.model.parameters())
        self.changed[record.step] = any(not torch.equal(a, b)
                                        for a, b in zip(after, self.before, strict=True))
        self.records.append(record)


def test_fp16_skips_a_step_with_inf_gradients_and_lowers_the_scale(tmp_path: Path) -> None:
    hook = InfOnStep(bad=1)
    hook.trainer = make_trainer(tmp_path, {"amp": {"dtype": "fp16", "init_scale": 1024.0}}, steps=3, hooks=[hook])
    hook.trainer.fit()
    assert [r.skipped for r in hook.records] == [False, True, False]
    assert hook.changed == {0: True, 1: False, 2: True}  # the bad step left every weight as it was
    assert [r.loss_scale for r in hook.records] == [1024.0, 512.0, 512.0]  # backoff factor 0.5


def test_apply_builds_the_scaler_from_the_config() -> None:
    setup = TrainSetup(model=GLMForCausalLM(model_config("tiny")))
    apply_amp(setup, AmpConfig(dtype="fp16", init_scale=256.0, growth_interval=7), context())
    assert setup.autocast_dtype is torch.float16
    assert setup.scaler.get_scale() == 256.0 and setup.scaler.get_growth_interval() == 7
    bf16 = TrainSetup(model=GLMForCausalLM(model_config("tiny")))
    apply_amp(bf16, AmpConfig(dtype="bf16"), context())
    assert bf16.autocast_dtype is torch.bfloat16 and bf16.scaler is None  # bf16 has fp32's range


def _check(dtype: str, device: str) -> str | None:
    switches = build_section(SwitchesConfig, {"amp": dtype}, "switches")
    (check,) = OPTIMIZATION.checks
    return check(switches, context(device=torch.device(device)))


def test_checks_refuse_what_cannot_run() -> None:
    assert _check("bf16", "cpu") is None and _check("fp16", "cpu") is None and _check("off", "mps") is None
    assert "GradScaler" in _check("fp16", "mps")


def test_check_refuses_bf16_on_a_gpu_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert "Tesla V100" in _check("bf16", "cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert _check("bf16", "cuda") is None
