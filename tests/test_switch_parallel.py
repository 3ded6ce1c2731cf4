"""The parallel switch on real torchrun ranks over gloo: FSDP2, tensor and pipeline parallelism train
like one process, FSDP holds half of DDP's model states per rank, and `glmperf plan` predicts what the ranks
measure.

One torchrun launch (tests/parallel_worker.py) trains the 2-rank scenarios, a second fsdp=2 x tp=2
on 4 ranks. Same losses means: the mean of the data replicas' losses (each on its share of the
global batch; the ranks of one tensor-parallel group or pipeline share a batch) equals one process's loss on
the whole batch within LOSS_TOL; sharded sums run in another order, so the low bits may differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from optimizers import SwitchesConfig
from profiler.advice.plan import plan
from profiler.config import build_run_config
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.trainer import Trainer
from tests.parallel_worker import SEQ_LEN, Losses
from tests.test_switch_ddp import torchrun

WORKER = Path(__file__).resolve().parent / "parallel_worker.py"
STEPS = 3
BATCH = 2
LOSS_TOL = 1e-4
"""Absolute tolerance on a step's loss (~5.8 on tiny): fp32 sums in another order."""
FSDP2 = {"parallel": {"fsdp": 2}}
TP2 = {"parallel": {"tp": 2}}
SP2 = {"parallel": {"tp": 2, "sequence_parallel": True}}
FSDP2_TP2 = {"parallel": {"fsdp": 2, "tp": 2}}
INTERLEAVED = {"pp": 2, "schedule": "interleaved_1f1b", "microbatches": 2}
"""Two chunks per rank, so at least 4 blocks: the `small` preset (rank 0 runs blocks 0 and 2, rank 1 1 and 3)."""
FOUR_RANKS = {"fsdp-tp": FSDP2_TP2,
              "dp-tp": TP2,
              "dp-pp": {"parallel": {"pp": 2, "microbatches": 2}},
              "pp-fsdp": {"parallel": {"pp": 2, "fsdp": 2, "microbatches": 2}},
              "pp-tp": {"parallel": {"pp": 2, "tp": 2, "sequence_parallel": True, "microbatches": 2,
                                     "schedule": "gpipe"}},
              "interleaved-fsdp": {"parallel": {**INTERLEAVED, "fsdp": 2}},
              "interleaved-sp": {"parallel": {**INTERLEAVED, "tp": 2, "sequence_parallel": True}}}
"""Layouts of 4 ranks; the mesh is pp x dp x fsdp x tp, so ranks (0, 1) and (2, 3) share a pipeline stage or
a data replica, and ranks (0, 2) and (1, 3) a tensor-parallel group or a pipeline. dp-tp and dp-pp: two
replicas of a tp=2 or pp=2 model (data parallelism is what the degrees leave of the world size)."""
PRESET = {"interleaved-fsdp": "small", "interleaved-sp": "small", "interleaved": "small",
          "small-interleaved": "small"}
"""A layout's preset where not `tiny`."""
PP2 = {"gpipe": {"parallel": {"pp": 2, "microbatches": 2, "schedule": "gpipe"}},
       "1f1b": {"parallel": {"pp": 2, "microbatches": 2, "schedule": "1f1b"}}}
SMALL_PP = {"parallel": {"pp": 2, "microbatches": 4, "schedule": "1f1b"}, "amp": {"dtype": "bf16"}}
"""More micro-batches than stages (the last stage keeps every micro-batch's logits), and autocast's
weight copies, which serve every micro-batch of the step."""
SMALL_INTERLEAVED = {"parallel": {**INTERLEAVED, "microbatches": 4}, "amp": {"dtype": "bf16"}}
SCENARIOS = [
    *[{"name": f"pp-{schedule}", "preset": "tiny", "switches": switches, "steps": STEPS, "batch_size": BATCH}
      for schedule, switches in PP2.items()],
    {"name": "small-pp", "preset": "small", "switches": SMALL_PP, "steps": 1, "batch_size": 2 * BATCH},
    {"name": "interleaved", "preset": "small", "switches": {"parallel": INTERLEAVED}, "steps": STEPS,
     "batch_size": BATCH},
    {"name": "small-interleaved", "preset": "small", "switches": SMALL_INTERLEAVED, "steps": 1,
     "batch_size": 2 * BATCH},
    {"name": "tp", "preset": "tiny", "switches": TP2, "steps": STEPS, "batch_size": BATCH},
    {"name": "small-tp", "preset": "small", "switches": TP2, "steps": 1, "batch_size": BATCH},
    {"name": "sp", "preset": "tiny", "switches": SP2, "steps": STEPS, "batch_size": BATCH},
    {"name": "small-sp", "preset": "small", "switches": SP2, "steps": 1, "batch_size": BATCH},
    {"name": "ddp", "preset": "tiny", "switches": {}, "steps": STEPS, "batch_size": BATCH},
    {"name": "fsdp", "preset": "tiny", "switches": FSDP2, "steps": STEPS, "batch_size": BATCH},
    {"name": "zero2", "preset": "tiny", "switches": {"parallel": {"fsdp": 2, "reshard_after_forward": False}},
     "steps": STEPS, "batch_size": BATCH},
    {"name": "small-ddp", "preset": "small", "switches": {}, "steps": 1, "batch_size": BATCH},
    {"name": "small-fsdp", "preset": "small", "switches": FSDP2, "steps": 1, "batch_size": BATCH},
]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("parallel")
    code, output = torchrun(out, SCENARIOS, worker=WORKER)
    if code != 0:
        pytest.fail(f"torchrun exited {code}:\n{output[-4000:]}")
    return [json.loads((out / f"rank{r}.json").read_text())["results"] for r in (0, 1)]


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("parallel4")
    scenarios = [{"name": name, "preset": PRESET.get(name, "tiny"), "switches": switches, "steps": STEPS,
                  "batch_size": BATCH} for name, switches in FOUR_RANKS.items()]
    code, output = torchrun(out, scenarios, worker=WORKER, nproc=4)
    if code != 0:
        pytest.fail(f"torchrun exited {code}:\n{output[-4000:]}")
    return [json.loads((out / f"rank{r}.json").read_text())["results"] for r in range(4)]


def one_process_losses(tmp_path: Path, batch_size: int = 2 * BATCH, preset: str = "tiny") -> list[float]:
    losses = Losses()
    Trainer(model_cfg=model_config(preset), data_cfg=DataConfig(corpus=["synthetic"], seq_len=SEQ_LEN),
            train_cfg=TrainConfig(batch_size=batch_size, steps=STEPS, device="cpu"),
            switches=SwitchesConfig(), hooks=[losses], run_dir=tmp_path).fit()
    return losses.values


@pytest.mark.parametrize("name", ["tp", "sp"])
def test_tensor_parallel_ranks_share_a_batch_and_train_like_one_process(ranks: list[dict], name: str,
                                                                         tmp_path: Path) -> None:
    r0, r1 = (r[name] for r in ranks)
    assert any(n.startswith("tensor_parallel: ") for n in r0["notes"]), r0["notes"]
    assert r0["losses"] == pytest.approx(r1["losses"], abs=1e-6)
    assert r0["losses"] == pytest.approx(one_process_losses(tmp_path, batch_size=BATCH), abs=LOSS_TOL)
    assert r0["held"]["params"] < ranks[0]["ddp"]["held"]["params"]


@pytest.mark.parametrize("schedule", list(PP2))
def test_a_two_stage_pipeline_trains_like_one_process(ranks: list[dict], schedule: str, tmp_path: Path) -> None:
    """Both stages report the last stage's loss of the shared batch; each holds about half the model
    (stage 0 the embedding and block 0, stage 1 block 1, the final norm and lm_head)."""
    r0, r1 = (r[f"pp-{schedule}"] for r in ranks)
    assert any(n.startswith("pipeline: stage 0 of 2") for n in r0["notes"]), r0["notes"]
    assert r0["losses"] == r1["losses"]
    assert r0["losses"] == pytest.approx(one_process_losses(tmp_path, batch_size=BATCH), abs=LOSS_TOL)
    assert r0["held"]["params"] + r1["held"]["params"] == ranks[0]["ddp"]["held"]["params"]


def test_an_interleaved_pipeline_trains_like_one_process(ranks: list[dict], tmp_path: Path) -> None:
    """Each rank runs two chunks, blocks 0 and 2 or 1 and 3; a micro-batch passes both ranks twice."""
    r0, r1 = (r["interleaved"] for r in ranks)
    assert any(n.startswith("pipeline: stage 0 of 2: blocks 0..0, 2..2, interleaved_1f1b") for n in r0["notes"])
    assert r0["losses"] == r1["losses"]
    assert r0["losses"] == pytest.approx(one_process_losses(tmp_path, batch_size=BATCH, preset="small"),
                                         abs=LOSS_TOL)
    assert r0["held"]["params"] + r1["held"]["params"] == ranks[0]["small-ddp"]["held"]["params"]


@pytest.mark.parametrize(("name", "preset", "switches", "batch_size"), [
    ("pp-gpipe", "tiny", PP2["gpipe"], BATCH), ("pp-1f1b", "tiny", PP2["1f1b"], BATCH),
    ("small-pp", "small", SMALL_PP, 2 * BATCH), ("small-interleaved", "small", SMALL_INTERLEAVED, 2 * BATCH)])
def test_plan_agrees_with_each_pipeline_stage(ranks: list[dict], name: str, preset: str, switches: dict[str, Any],
                                              batch_size: int) -> None:
    """Per stage: the model states it holds, the peak of the activations its schedule keeps alive (GPipe
    every micro-batch on both stages, 1F1B two on the first and one on the last, plus the last stage's
    logits of the finished ones) and autocast's weight copies (the buffers without FSDP)."""
    cfg = build_run_config({"model": {"preset": preset}, "data": {"seq_len": SEQ_LEN},
                            "train": {"batch_size": batch_size}, "switches": switches})
    planned = plan(cfg, 2).per_stage_bytes
    for stage, results in enumerate(ranks):
        measured = results[name]
        for part in ("params", "grads", "optimizer"):
            assert planned[stage][part] == pytest.approx(measured["held"][part], rel=0.10), (name, stage, part)
        assert planned[stage]["activations"] == pytest.approx(measured["activations"], rel=0.10), (name, stage)
        assert planned[stage]["buffers"] == pytest.approx(measured["weight_copies"], rel=0.10), (name, stage)
    if name == "small-pp":  # 1F1B: the first stage keeps two micro-batches in flight, the last one
        assert ranks[0][name]["activations"] > 1.3 * ranks[1][name]["activations"]


@pytest.mark.parametrize("name", ["fsdp-tp", "dp-tp"])
def test_tp_beside_data_parallelism_on_four_ranks_trains_like_one_process(four_ranks: list[dict], name: str,
                                                                          tmp_path: Path) -> None:
    ranks = [r[name] for r in four_ranks]
    losses = [r["losses"] for r in ranks]  # ranks (0, 1) and (2, 3) are tensor-parallel pairs
    assert losses[0] == pytest.approx(losses[1], abs=1e-6) and losses[2] == pytest.approx(losses[3], abs=1e-6)
    mean = [(a + b) / 2 for a, b in zip(losses[0], losses[2], strict=True)]
    assert mean == pytest.approx(one_process_losses(tmp_path), abs=LOSS_TOL)
    cfg = build_run_config({"model": {"preset": "tiny"}, "data": {"seq_len": SEQ_LEN},
                            "train": {"batch_size": BATCH}, "switches": FOUR_RANKS[name]})
    planned = plan(cfg, 4).per_rank_bytes
    for r in ranks:
        for part in ("params", "grads", "optimizer"):
            assert planned[part] == pytest.approx(r["held"][part], rel=0.10), part
        assert planned["activations"] == pytest.approx(r["activations"], rel=0.10)


@pytest.mark.parametrize("name", ["pp-fsdp", "interleaved-fsdp", "dp-pp"])
def test_a_pipeline_beside_data_parallelism_trains_like_one_process(four_ranks: list[dict], name: str,
                                                                    tmp_path: Path) -> None:
    """Stage 0 on ranks 0 and 1, stage 1 on 2 and 3, each stage sharded over its two ranks (or replicated on
    them): the pipelines (0, 2) and (1, 3) each train their half of the batch, and the stages reduce their
    gradients once a step."""
    losses = [r[name]["losses"] for r in four_ranks]
    assert losses[0] == losses[2] and losses[1] == losses[3]
    assert losses[0][0] != pytest.approx(losses[1][0], abs=1e-3)
    mean = [(a + b) / 2 for a, b in zip(losses[0], losses[1], strict=True)]
    assert mean == pytest.approx(one_process_losses(tmp_path, preset=PRESET.get(name, "tiny")), abs=LOSS_TOL)


@pytest.mark.parametrize("name", ["pp-tp", "interleaved-sp"])
def test_a_pipeline_beside_tensor_parallelism_trains_like_one_process(four_ranks: list[dict], name: str,
                                                                      tmp_path: Path) -> None:
    losses = [r[name]["losses"] for r in four_ranks]
    assert all(loss == pytest.approx(losses[0], abs=1e-6) for loss in losses)
    assert losses[0] == pytest.approx(one_process_losses(tmp_path, batch_size=BATCH, preset=PRESET.get(name, "tiny")),
                                      abs=LOSS_TOL)


@pytest.mark.parametrize("name", ["pp-fsdp", "pp-tp", "interleaved-fsdp", "interleaved-sp", "dp-pp"])
def test_plan_agrees_with_each_stage_of_a_composed_pipeline(four_ranks: list[dict], name: str) -> None:
    cfg = build_run_config({"model": {"preset": PRESET.get(name, "tiny")}, "data": {"seq_len": SEQ_LEN},
                            "train": {"batch_size": BATCH}, "switches": FOUR_RANKS[name]})
    planned = plan(cfg, 4).per_stage_bytes
    for rank, results in enumerate(four_ranks):
        measured, stage = results[name], rank // 2
        for part in ("params", "grads", "optimizer"):
            assert planned[stage][part] == pytest.approx(measured["held"][part], rel=0.10), (name, rank, part)
        assert planned[stage]["activations"] == pytest.approx(measured["activations"], rel=0.10), (name, rank)


@pytest.mark.parametrize("name", ["fsdp", "zero2"])
def test_fsdp_trains_to_the_losses_of_one_process(ranks: list[dict], name: str, tmp_path: Path) -> None:
    r0, r1 = (r[name] for r in ranks)
    assert any(n.startswith("fsdp: ") for n in r0["notes"]), r0["notes"]
    assert r0["losses"][0] != pytest.approx(r1["losses"][0], abs=1e-3)  # each rank trains on its own half
    mean = [(a + b) / 2 for a, b in zip(r0["losses"], r1["losses"], strict=True)]
    assert mean == pytest.approx(one_process_losses(tmp_path), abs=LOSS_TOL)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_fsdp_holds_half_of_ddps_model_states(ranks: list[dict], preset: str) -> None:
    prefix = "" if preset == "tiny" else "small-"
    for results in ranks:
        ddp, fsdp = results[f"{prefix}ddp"]["held"], results[f"{prefix}fsdp"]["held"]
        for part in ("params", "grads", "optimizer"):
            assert fsdp[part] / ddp[part] == pytest.approx(0.5, abs=0.025), (preset, part)


@pytest.mark.parametrize(("name", "preset", "switches"), [
    ("ddp", "tiny", {}), ("fsdp", "tiny", FSDP2), ("tp", "tiny", TP2), ("sp", "tiny", SP2),
    ("small-ddp", "small", {}), ("small-fsdp", "small", FSDP2), ("small-tp", "small", TP2),
    ("small-sp", "small", SP2)])
def test_plan_agrees_with_what_the_ranks_hold(ranks: list[dict], name: str, preset: str,
                                              switches: dict[str, Any]) -> None:
    cfg = build_run_config({"model": {"preset": preset}, "data": {"seq_len": SEQ_LEN},
                            "train": {"batch_size": BATCH}, "switches": switches})
    planned = plan(cfg, 2).per_rank_bytes
    for results in ranks:
        measured = results[name]
        for part in ("params", "grads", "optimizer"):
            assert planned[part] == pytest.approx(measured["held"][part], rel=0.10), (name, part)
        assert planned["activations"] == pytest.approx(measured["activations"], rel=0.10), name


def test_sequence_parallelism_saves_less_than_tensor_parallelism_alone(ranks: list[dict]) -> None:
    """The block norms and the residual stream hold half the sequence: on `small` (its activations
    outweigh its logits) that is most of what a rank saves outside the matmuls."""
    for results in ranks:
        assert results["small-sp"]["activations"] < 0.9 * results["small-tp"]["activations"]

