"""compile: per-block torch.compile trains like eager, keeps the state dict, and flags its compile step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from optimizers import SwitchesConfig
from optimizers.compile import OPTIMIZATION, cxx_candidates
from optimizers.config import build_section
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.trainer import Trainer
from tests.contexts import context


class Records(TrainerHook):
    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def on_step_end(self, record: StepRecord) -> None:
        self.records.append(record)


def run(tmp_path: Path, switches: dict) -> tuple[Trainer, list[StepRecord]]:
    hook = Records()
    trainer = Trainer(model_cfg=model_config("tiny"), data_cfg=DataConfig(corpus=["synthetic"], seq_len=32),
                      train_cfg=TrainConfig(batch_size=4, steps=5, device="cpu"),
                      switches=build_section(SwitchesConfig, switches, "switches"), hooks=[hook],
                      run_dir=tmp_path)
    trainer.fit()
    return trainer, hook.records


@pytest.mark.slow
def test_block_compile_matches_eager(tmp_path: Path) -> None:
    """One compile (about 50 s on 2 CPU cores with a cold inductor cache, seconds warm): the only one."""
    eager, eager_records = run(tmp_path / "eager", {})
    torch._dynamo.reset()
    counters.clear()
    compiled, records = run(tmp_path / "compiled", {"compile": {"mode": "default", "scope": "block"}})
    assert compiled.setup.compiled
    assert [r.warmup for r in records] == [True, False, False, False, False]  # step 0 holds compile time
    torch.testing.assert_close(torch.stack([r.loss for r in records]),
                               torch.stack([r.loss for r in eager_records]), rtol=1e-4, atol=0)
    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())  # no _orig_mod. prefix
    # the two identical blocks share one graph: compile time does not grow with depth
    assert counters["stats"]["unique_graphs"] == 1


def test_check_needs_the_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    switches = build_section(SwitchesConfig, {"compile": "default"}, "switches")
    (check,) = OPTIMIZATION.checks
    cpu = context(device=torch.device("cpu"))
    assert check(switches, cpu) is None  # g++ is on this machine: the compile test above needs it
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "C++ compiler" in check(switches, cpu)
    assert check(build_section(SwitchesConfig, {}, "switches"), cpu) is None


@pytest.mark.parametrize("cxx", [None, "clang++-17"])
def test_the_compilers_checked_are_the_ones_inductor_tries(cxx: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if cxx is None:
        monkeypatch.delenv("CXX", raising=False)
    else:
        monkeypatch.setenv("CXX", cxx)
    inductors = subprocess.run([sys.executable, "-c", "from torch._inductor import config; print(*config.cpp.cxx)"],
                               capture_output=True, text=True, check=True).stdout.split()  # it reads $CXX when loaded
    assert cxx_candidates() == [c for c in inductors if c != "None"]
