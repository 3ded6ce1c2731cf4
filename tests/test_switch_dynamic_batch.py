"""Dynamic batching: the latency controller within its bounds and through the real trainer; the
memory-fit finder against budgets derived from the measurement itself (machine independent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from optimizers import SwitchesConfig, check_all
from optimizers.config import ConfigError, build_section
from optimizers.dynamic_batch import LatencyController, find_fitting_batch, measure_peak_bytes
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.context import setup_context
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.model import GLMForCausalLM
from reference_model.trainer import Trainer
from tests.contexts import context

CFG = model_config("tiny")
CPU = torch.device("cpu")


def controller(batch_size: int = 8) -> LatencyController:
    return LatencyController(batch_size=batch_size, target_s=0.1, min_batch=2, max_batch=12,
                             shrink_step=3, grow_step=1)


def test_slow_steps_shrink_the_batch_but_never_below_min() -> None:
    ctl = controller()
    sizes = [ctl.observe(0.5, None) for _ in range(5)]
    assert sizes == [5, 2, 2, 2, 2]
    assert ctl.batch_size == 2


def test_fast_steps_grow_the_batch_up_to_max() -> None:
    ctl = controller()
    sizes = [ctl.observe(0.01, None) for _ in range(6)]
    assert sizes == [9, 10, 11, 12, 12, 12]


def test_start_outside_the_bounds_is_clamped() -> None:
    assert controller(batch_size=100).batch_size == 12
    assert controller(batch_size=1).batch_size == 2


class Watch(TrainerHook):
    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.events: list[dict[str, Any]] = []

    def on_step_end(self, record: StepRecord) -> None:
        self.records.append(record)

    def on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def trainer(tmp_path: Path, dynamic: dict[str, Any], *, steps: int, batch_size: int = 4, seq_len: int = 32,
            memory_budget_bytes: int | None = None, hook: TrainerHook | None = None) -> Trainer:
    data_cfg = DataConfig(corpus=["synthetic"], seq_len=seq_len)
    train_cfg = TrainConfig(batch_size=batch_size, steps=steps, device="cpu")
    return Trainer(model_cfg=CFG, data_cfg=data_cfg, train_cfg=train_cfg,
                   switches=build_section(SwitchesConfig, {"dynamic_batch": dynamic}, "switches"),
                   hooks=[hook] if hook else [], run_dir=tmp_path,
                   ctx=setup_context(train_cfg, data_cfg, memory_budget_bytes=memory_budget_bytes))


def test_trainer_shrinks_the_batch_when_every_step_misses_the_target(tmp_path: Path) -> None:
    watch = Watch()
    dynamic = {"mode": "latency", "target_latency_ms": 0.001, "min_batch": 2, "shrink_step": 2}
    trainer(tmp_path, dynamic, steps=5, batch_size=8, hook=watch).fit()
    assert [r.batch_size for r in watch.records] == [8, 6, 4, 2, 2]
    changes = [(e["from"], e["to"]) for e in watch.events if e["kind"] == "batch_size"]
    assert changes == [(8, 6), (6, 4), (4, 2)]
    assert [r.tokens for r in watch.records] == [r.batch_size * 32 for r in watch.records]


def test_latency_mode_is_refused_under_ddp() -> None:
    switches = build_section(SwitchesConfig, {"dynamic_batch": "latency"}, "switches")
    with pytest.raises(ConfigError, match="switches.dynamic_batch"):
        check_all(switches, context(world_size=2))


def test_finder_doubles_then_bisects_and_treats_oom_as_not_fitting() -> None:
    tried: list[int] = []

    def trial(batch: int) -> int:
        tried.append(batch)
        if batch >= 40:
            raise torch.OutOfMemoryError("simulated")
        return 1000 + 100 * batch

    # limit 0.9 * 5000 = 4500 -> batch 35 fits (4500), 36 does not
    assert find_fitting_batch(trial, budget_bytes=5000, margin=0.1, lo=1, hi=64) == 35
    assert tried[:7] == [1, 2, 4, 8, 16, 32, 64] and 36 in tried
    assert find_fitting_batch(lambda b: 0, budget_bytes=1, margin=0.0, lo=3, hi=20) == 20
    with pytest.raises(RuntimeError, match="even batch 1"):
        find_fitting_batch(trial, budget_bytes=500, margin=0.0, lo=1, hi=8)


def test_measured_peak_grows_with_the_batch_and_counts_params_grads_and_state() -> None:
    model = GLMForCausalLM(CFG)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    peaks = [measure_peak_bytes(model, b, 32, CFG.vocab_size, CPU, None) for b in (1, 2, 4)]
    assert peaks[0] > 4 * param_bytes  # params + grads + 2x for AdamW + activations
    assert peaks[0] < peaks[1] < peaks[2]
    assert peaks[2] - peaks[1] == pytest.approx(2 * (peaks[1] - peaks[0]), rel=0.05)  # linear in the batch
    assert all(p.grad is None for p in model.parameters())  # the measurement leaves no gradients behind


def test_fit_finds_the_largest_batch_under_a_measured_budget() -> None:
    model = GLMForCausalLM(CFG)

    def trial(batch: int) -> int:
        return measure_peak_bytes(model, batch, 32, CFG.vocab_size, CPU, None)

    margin = 0.2
    budget = int(trial(5) / (1 - margin)) + 1  # batch 5 fits by construction
    found = find_fitting_batch(trial, budget_bytes=budget, margin=margin, lo=1, hi=64)
    assert found == 5
    assert trial(found) <= (1 - margin) * budget < trial(found + 1)


def test_fit_mode_starts_the_trainer_at_the_found_batch(tmp_path: Path) -> None:
    seq_len = 48  # not DataConfig's default: the trials must use the run's sequence length
    model = GLMForCausalLM(CFG)
    budget = int(measure_peak_bytes(model, 6, seq_len, CFG.vocab_size, CPU, None) / 0.9) + 1
    watch = Watch()
    run = trainer(tmp_path, {"mode": "fit", "max_batch": 16, "fit_margin": 0.1}, steps=2, seq_len=seq_len,
                  memory_budget_bytes=budget, hook=watch)
    run.fit()
    assert [r.batch_size for r in watch.records] == [6, 6]
    assert not [e for e in watch.events if e["kind"] == "batch_size"]
