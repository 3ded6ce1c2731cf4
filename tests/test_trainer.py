"""The reference trainer: it learns, it resumes exactly, it never loads a damaged checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from optimizers import SwitchesConfig
from optimizers.config import build_section
from reference_model.checkpoint import list_checkpoints, load_latest, save_checkpoint
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.trainer import Trainer


class Losses(TrainerHook):
    def __init__(self, stop_after: int | None = None) -> None:
        self.losses: dict[int, float] = {}
        self.stop_after = stop_after

    def on_step_end(self, record: StepRecord) -> None:
        self.losses[record.step] = float(record.loss)
        if self.stop_after is not None and record.step + 1 == self.stop_after:
            raise KeyboardInterrupt("simulated crash")


def make_trainer(tmp_path: Path, *, steps: int, hooks=(), switches: dict | None = None,
                 corpus: str = "synthetic", seq_len: int = 32, batch: int = 4) -> Trainer:
    return Trainer(model_cfg=model_config("tiny"), data_cfg=DataConfig(corpus=[corpus], seq_len=seq_len),
                   train_cfg=TrainConfig(batch_size=batch, steps=steps, device="cpu", lr=3e-3),
                   switches=build_section(SwitchesConfig, switches or {}, "switches"),
                   hooks=hooks, run_dir=tmp_path)


def test_tiny_run_learns_the_stdlib_corpus(tmp_path: Path) -> None:
    hook = Losses()
    make_trainer(tmp_path, steps=100, hooks=[hook], corpus="stdlib", seq_len=64, batch=8).fit()
    first = sum(hook.losses[s] for s in range(5)) / 5
    last = sum(hook.losses[s] for s in range(95, 100)) / 5
    assert last < first * 2 / 3, (first, last)


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path: Path) -> None:
    ckpt = {"checkpoint": {"every": 4, "keep": 2}}
    full = Losses()
    make_trainer(tmp_path / "a", steps=10, hooks=[full], switches=ckpt).fit()

    crashed = Losses(stop_after=6)  # checkpoint at step 4 is on disk; steps 4 and 5 are lost
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path / "b", steps=10, hooks=[crashed], switches=ckpt).fit()
    resumed = Losses()
    trainer = make_trainer(tmp_path / "b", steps=10, hooks=[resumed],
                           switches={"checkpoint": {"every": 4, "keep": 2, "resume": True}})
    assert trainer.start_step == 4
    trainer.fit()
    assert sorted(resumed.losses) == list(range(4, 10))
    for step, loss in resumed.losses.items():
        assert loss == full.losses[step], step  # exact, not approximate


def test_keep_last_k_checkpoints(tmp_path: Path) -> None:
    make_trainer(tmp_path, steps=8, switches={"checkpoint": {"every": 2, "keep": 2}}).fit()
    assert [step for step, _ in list_checkpoints(tmp_path / "checkpoints")] == [6, 8]


def test_a_checkpoint_cut_short_is_never_loaded(tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    good = {"w": torch.arange(1000.0)}
    save_checkpoint(directory, 1, good, keep=5)
    newest = save_checkpoint(directory, 2, {"w": torch.zeros(1000)}, keep=5)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a crash mid-copy
    (directory / "ckpt-00000003.pt.tmp").write_bytes(b"partial")  # a crash mid-save
    step, state, _ = load_latest(directory)
    assert step == 1
    assert torch.equal(state["w"], good["w"])


def test_checkpoints_load_with_weights_only(tmp_path: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("code ran",))

    directory = tmp_path / "ck"
    directory.mkdir()
    with open(directory / "ckpt-00000001.pt", "wb") as f:
        torch.save({"x": Evil()}, f, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    assert load_latest(directory) is None  # refused, not executed


def test_blank_infilling_objective_trains(tmp_path: Path) -> None:
    hook = Losses()
    trainer = Trainer(model_cfg=model_config("tiny"),
                      data_cfg=DataConfig(corpus=["synthetic"], seq_len=48, objective="blank_infilling"),
                      train_cfg=TrainConfig(batch_size=4, steps=30, device="cpu", lr=3e-3),
                      hooks=[hook], run_dir=tmp_path)
    trainer.fit()
    assert all(torch.isfinite(torch.tensor(list(hook.losses.values()))))
    assert hook.losses[29] < hook.losses[0]
