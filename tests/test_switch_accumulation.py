"""grad_accumulation: 4 micro-batches of 2 give the gradients of one batch of 8 (same samples)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from optimizers import SwitchesConfig
from optimizers.config import build_section
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.trainer import Trainer


class GradsBeforeStep(TrainerHook):
    """Copies every gradient when the optimizer phase starts (before unscale, clipping and the update)."""

    def on_phase_start(self, step: int, phase: str) -> None:
        if phase == "optimizer":
            self.grads = {n: p.grad.clone() for n, p in self.trainer.model.named_parameters()}


def make_trainer(tmp_path: Path, *, batch_size: int, accumulation: int,
                 objective: str = "causal") -> tuple[Trainer, GradsBeforeStep]:
    hook = GradsBeforeStep()
    trainer = Trainer(model_cfg=model_config("tiny"),
                      data_cfg=DataConfig(corpus=["synthetic"], seq_len=32, objective=objective),
                      train_cfg=TrainConfig(batch_size=batch_size, steps=1, device="cpu"),
                      switches=build_section(SwitchesConfig, {"grad_accumulation": accumulation}, "switches"),
                      hooks=[hook], run_dir=tmp_path)
    hook.trainer = trainer
    return trainer, hook


@pytest.mark.parametrize("objective", ["causal", "blank_infilling"])
def test_four_micro_batches_of_two_equal_one_batch_of_eight(tmp_path: Path, objective: str) -> None:
    """Also with blank infilling, whose samples carry different numbers of labels: micro-batches are
    weighted by their labelled tokens, not equally."""
    big, big_hook = make_trainer(tmp_path / "big", batch_size=8, accumulation=1, objective=objective)
    small, small_hook = make_trainer(tmp_path / "small", batch_size=2, accumulation=4, objective=objective)
    assert small.setup.accumulation_steps == 4
    for (name, a), b in zip(big.model.state_dict().items(), small.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # same seed, same initial weights

    batch = next(iter(big.loader))  # 8 windows of 32 tokens
    micro = [{k: v[i:i + 2] for k, v in batch.items()} for i in range(0, 8, 2)]
    big_record: StepRecord = big.train_step(0, iter([batch]))
    small_record: StepRecord = small.train_step(0, iter(micro))

    for name, grad in big_hook.grads.items():
        torch.testing.assert_close(small_hook.grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert (small_record.micro_batches, big_record.micro_batches) == (4, 1)
    assert small_record.tokens == big_record.tokens == 8 * 32
    torch.testing.assert_close(small_record.loss, big_record.loss)
    torch.testing.assert_close(small_record.grad_norm, big_record.grad_norm)


def test_an_accumulating_run_may_double_its_micro_batch_under_checkpointing_only_where_a_probe_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler.advice.probes import MIN_ROUNDS, Prober
    from profiler.advice.recommend import SPEED_ASSUMED, explore, recommend
    from profiler.analysis import analyze, load_run
    from tests.conftest import tiny_run

    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path / "cache"))
    run = load_run(tiny_run(tmp_path / "runs", "switches.grad_accumulation.steps=2", "profile.trace=false"))
    change = {"switches.grad_accumulation.steps": 1, "train.batch_size": 8, "switches.activation_checkpointing.mode":
              "full"}  # the same global batch of 8 (tests.conftest.TINY: batch 4)
    assert change in [r["set"] for r in explore(run, probing=True)["recommendations"]]
    (modelled,) = [e for e in recommend(run, analyze(run), SPEED_ASSUMED)["excluded"] if e["set"] == change]
    assert modelled["reason"].startswith("not modelled: larger matmuls against a recomputed forward")
    with Prober(run.config, device=run.device) as prober:  # and a probe runs it, tokens counted per step
        probe = prober.measure(change, budget_s=5)
    assert probe.rounds >= MIN_ROUNDS and all(0 < r < 10 for r in probe.step_ratios())
