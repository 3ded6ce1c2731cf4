"""Checkpoints of sharded layouts on real torchrun ranks over gloo: saved in the one-process form, a
checkpoint of fsdp, tp, pp or fsdp x tp ranks resumes on its own layout exactly and in one process like the run
that never stopped, and a one-process checkpoint resumes on each of those layouts.

A torchrun launch (tests/parallel_worker.py) of 2 ranks, and one of 4 for fsdp x tp, runs per
layout a save run (3 steps, a checkpoint after step 2), a resume of it (step 2 again) and a resume
of a one-process checkpoint of the same global batch. Losses are compared at step 2, the first step
after the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from optimizers import SwitchesConfig
from optimizers.config import build_section
from reference_model.checkpoint import list_checkpoints
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.trainer import Trainer
from tests.parallel_worker import SEQ_LEN, Losses
from tests.test_switch_ddp import torchrun
from tests.test_switch_parallel import (
    BATCH,
    FOUR_RANKS,
    FSDP2,
    FSDP2_TP2,
    INTERLEAVED,
    LOSS_TOL,
    PP2,
    PRESET,
    SP2,
    TP2,
    WORKER,
)

SAVED = 2
STEPS = SAVED + 1
LAYOUTS = {"fsdp": FSDP2, "tp": TP2, "sp": SP2, "pp": PP2["1f1b"], "fsdp-tp": FSDP2_TP2,
           "pp-fsdp": FOUR_RANKS["pp-fsdp"], "interleaved": {"parallel": INTERLEAVED}, "dp-tp": FOUR_RANKS["dp-tp"]}
NPROC = {"fsdp-tp": 4, "pp-fsdp": 4, "dp-tp": 4}
"""Ranks of a layout's launch (2 unless named)."""
GLOBAL_BATCH = {"fsdp": 2 * BATCH, "tp": BATCH, "sp": BATCH, "pp": BATCH, "fsdp-tp": 2 * BATCH, "pp-fsdp": 2 * BATCH,
                "interleaved": BATCH, "dp-tp": 2 * BATCH}
"""One process's batch for the same data as the layout's ranks (fsdp splits it, tp and pp share it)."""
pytestmark = pytest.mark.slow


def _switches(layout: dict[str, Any], directory: Path, *, resume: bool) -> dict[str, Any]:
    return {**layout, "checkpoint": {"every": 0 if resume else SAVED, "dir": str(directory), "resume": resume}}


def _one(layout: str) -> str:
    """The one-process run a layout is checked against: its preset and global batch."""
    return f"one-{PRESET.get(layout, 'tiny')}-{GLOBAL_BATCH[layout]}"


def one_process(directory: Path, batch_size: int, *, resume: bool, preset: str = "tiny") -> list[float]:
    """A one-process run of STEPS steps that saves after step SAVED (or resumes from `directory`)."""
    losses = Losses()
    Trainer(model_cfg=model_config(preset), data_cfg=DataConfig(corpus=["synthetic"], seq_len=SEQ_LEN),
            train_cfg=TrainConfig(batch_size=batch_size, steps=STEPS, device="cpu"),
            switches=build_section(SwitchesConfig, _switches({}, directory, resume=resume), "switches"),
            hooks=[losses]).fit()
    return losses.values


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("parallel-checkpoint")
    one: dict[str, list[float]] = {}
    for name in LAYOUTS:
        if _one(name) not in one:
            one[_one(name)] = one_process(out / _one(name), GLOBAL_BATCH[name], resume=False,
                                          preset=PRESET.get(name, "tiny"))
    ranks: dict[str, list[dict[str, Any]]] = {}
    for nproc in sorted({NPROC.get(name, 2) for name in LAYOUTS}):
        scenarios = []
        for name in (n for n in LAYOUTS if NPROC.get(n, 2) == nproc):
            saved, layout = out / name, LAYOUTS[name]
            three = [
                {"name": f"{name}-save", "switches": _switches(layout, saved, resume=False)},
                {"name": f"{name}-resume", "switches": _switches(layout, saved, resume=True)},
                {"name": f"{name}-from-one",
                 "switches": _switches(layout, out / _one(name), resume=True)},
            ]
            scenarios += [{**s, "preset": PRESET.get(name, "tiny"), "steps": STEPS, "batch_size": BATCH} for s in three]
        launch = out / f"ranks{nproc}"
        launch.mkdir()
        code, output = torchrun(launch, scenarios, worker=WORKER, nproc=nproc)
        if code != 0:
            pytest.fail(f"torchrun exited {code}:\n{output[-4000:]}")
        results = [json.loads((launch / f"rank{r}.json").read_text())["results"] for r in range(nproc)]
        ranks.update({name.removesuffix("-save"): results for name in results[0] if name.endswith("-save")})
    return {"out": out, "ranks": ranks, "one": one}


def _step_loss(ranks: list[dict[str, Any]], name: str) -> float:
    """The loss of the global batch at the step after the checkpoint: the mean over the ranks (data
    replicas each train on their share of the batch; the ranks of a tp group or pipeline share one and
    report the same loss)."""
    values = [r[name]["losses"][-1] for r in ranks]
    return sum(values) / len(values)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_sharded_checkpoint_resumes_its_own_layout_exactly(runs: dict[str, Any], layout: str) -> None:
    assert [step for step, _ in list_checkpoints(runs["out"] / layout)] == [SAVED]
    for rank in runs["ranks"][layout]:
        assert len(rank[f"{layout}-resume"]["losses"]) == STEPS - SAVED  # it started after the checkpoint
        assert rank[f"{layout}-resume"]["losses"] == pytest.approx(rank[f"{layout}-save"]["losses"][SAVED:],
                                                                    abs=1e-6)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_sharded_checkpoint_resumes_in_one_process(runs: dict[str, Any], layout: str, tmp_path: Path) -> None:
    resumed = one_process(runs["out"] / layout, GLOBAL_BATCH[layout], resume=True, preset=PRESET.get(layout, "tiny"))
    assert len(resumed) == STEPS - SAVED
    assert resumed[0] == pytest.approx(_step_loss(runs["ranks"][layout], f"{layout}-save"), abs=LOSS_TOL)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_one_process_checkpoint_resumes_on_each_layout(runs: dict[str, Any], layout: str) -> None:
    uninterrupted = runs["one"][_one(layout)]
    assert _step_loss(runs["ranks"][layout], f"{layout}-from-one") == pytest.approx(uninterrupted[SAVED],
                                                                                    abs=LOSS_TOL)
