"""Loader workers: the same batches (so the same losses), and a slow input pipeline hidden behind compute."""

from __future__ import annotations

import time
from pathlib import Path

from optimizers import SwitchesConfig, TrainSetup
from optimizers.config import build_section
from optimizers.dataloader import DataLoaderConfig, apply_dataloader, loader_options
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.model import GLMForCausalLM
from reference_model.trainer import Trainer
from tests.contexts import context

STEPS = 10


def test_worker_only_options_are_passed_only_with_workers() -> None:
    assert loader_options(DataLoaderConfig(prefetch_factor=4, persistent_workers=True)) == {
        "num_workers": 0, "pin_memory": False}
    assert loader_options(DataLoaderConfig(num_workers=2, prefetch_factor=4, pin_memory=True)) == {
        "num_workers": 2, "pin_memory": True, "prefetch_factor": 4, "persistent_workers": False}


def test_useless_settings_are_allowed_and_said() -> None:
    setup = TrainSetup(model=GLMForCausalLM(model_config("tiny")))
    apply_dataloader(setup, DataLoaderConfig(pin_memory=True, prefetch_factor=4), context())
    assert setup.loader_options == {"num_workers": 0, "pin_memory": True}
    note = " ".join(setup.notes)
    assert "pin_memory on a CPU device" in note and "ignored without workers" in note


class DataWait(TrainerHook):
    """Host time inside the trainer's data phase per step, and the losses."""

    def __init__(self) -> None:
        self.wait: dict[int, float] = {}
        self.losses: list[float] = []
        self._t0 = 0.0

    def on_phase_start(self, step: int, phase: str) -> None:
        if phase == "data":
            self._t0 = time.perf_counter()

    def on_phase_end(self, step: int, phase: str) -> None:
        if phase == "data":
            self.wait[step] = self.wait.get(step, 0.0) + time.perf_counter() - self._t0

    def on_step_end(self, record: StepRecord) -> None:
        self.losses.append(float(record.loss))


def run(tmp_path: Path, workers: int) -> DataWait:
    hook = DataWait()
    data = DataConfig(corpus=["synthetic"], seq_len=32, io_delay_ms=30)
    Trainer(model_cfg=model_config("tiny"), data_cfg=data,
            train_cfg=TrainConfig(batch_size=4, steps=STEPS, device="cpu"),
            switches=build_section(SwitchesConfig, {"dataloader": {"num_workers": workers}}, "switches"),
            hooks=[hook], run_dir=tmp_path / str(workers)).fit()
    return hook


def test_workers_give_the_same_losses_and_hide_the_input_delay(tmp_path: Path) -> None:
    inline, workers = run(tmp_path, 0), run(tmp_path, 2)
    assert workers.losses == inline.losses  # batches are a function of (seed, step), not of the worker
    # step 0 includes starting the workers; after it, 2 workers load 2 batches per 30 ms while the
    # step computes, so the trainer waits far less than the 30 ms it waits per step without them
    inline_wait = sum(inline.wait[s] for s in range(1, STEPS))
    workers_wait = sum(workers.wait[s] for s in range(1, STEPS))
    assert inline_wait >= (STEPS - 1) * 0.030
    assert workers_wait < 0.7 * inline_wait
