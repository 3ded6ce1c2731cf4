"""`glmperf plan`: per-rank bytes by layout, the glm4-9b on 8 H200 question, bad layouts refused
before anything starts, and the --json fields. In-process and fast: the plan builds models on the
meta device and traces them under FakeTensorMode."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from optimizers import ConfigError
from profiler.advice.gpus import GPUS_GB
from profiler.advice.plan import plan
from profiler.advice.saved_tensors import saved_bytes
from profiler.config import build_run_config, load_config
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM

REPO = Path(__file__).resolve().parents[1]
H200 = int(GPUS_GB["h200"] * 1e9)


def config(preset: str, *, parallel: dict[str, Any] | None = None, **switches: Any) -> Any:
    return build_run_config({"model": {"preset": preset}, "data": {"seq_len": 64}, "train": {"batch_size": 4},
                             "switches": {"parallel": parallel or {}, **switches}})


def test_sharding_divides_the_model_states_by_the_degrees() -> None:
    ddp = plan(config("small"), 4).per_rank_bytes
    params = 4 * GLMForCausalLM(model_config("small")).num_params()
    assert ddp["params"] == ddp["grads"] == params
    fsdp = plan(config("small", parallel={"fsdp": 4}), 4).per_rank_bytes
    for part in ("params", "grads", "optimizer"):
        assert fsdp[part] == pytest.approx(ddp[part] / 4, rel=0.01), part
    assert fsdp["activations"] == ddp["activations"]  # FSDP shards states, not activations
    tp = plan(config("small", parallel={"tp": 2}), 2).per_rank_bytes
    assert ddp["params"] / 2 < tp["params"] < ddp["params"]  # blocks split, embedding and lm_head whole
    assert tp["activations"] < ddp["activations"]
    pp = plan(config("small", parallel={"pp": 2, "microbatches": 2}), 2)
    assert pp.per_rank_bytes["params"] < ddp["params"]
    assert pp.bubble == pytest.approx(1 / 3)  # (p-1)/(m+p-1)


def test_zero2_keeps_every_block_gathered_and_sends_less() -> None:
    zero3 = plan(config("small", parallel={"fsdp": 2}), 2)
    zero2 = plan(config("small", parallel={"fsdp": 2, "reshard_after_forward": False}), 2)
    assert zero2.per_rank_bytes["buffers"] > zero3.per_rank_bytes["buffers"]
    assert zero2.comm_bytes_per_step["all_gather"] < zero3.comm_bytes_per_step["all_gather"]
    assert zero3.comm_bytes_per_step["reduce_scatter"] == zero2.comm_bytes_per_step["reduce_scatter"] > 0


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_activations_agree_with_a_real_forward(preset: str) -> None:
    """The plan's trace (fake tensors, 1- and 2-block models scaled) against the same count on the real
    model's forward; checkpointing keeps less."""
    cfg = config(preset)
    planned = plan(cfg, 1)
    ids = torch.zeros(4, 64, dtype=torch.long)
    real = saved_bytes(GLMForCausalLM(cfg.model), ids, None)
    assert planned.per_rank_bytes["activations"] == pytest.approx(real, rel=0.10)
    by_ac = planned.activations_by_checkpointing
    assert max(by_ac["full"], by_ac["selective"]) < by_ac["off"] == planned.per_rank_bytes["activations"]


def test_glm4_9b_fits_8_h200s_only_when_sharded() -> None:
    cfg = load_config(preset="glm4-9b", nproc=8, check_here=False,
                      overrides=["switches.parallel.fsdp=8", "switches.activation_checkpointing=full"])
    sharded = plan(cfg, 8, capacity_bytes=H200)
    assert sharded.fits and sharded.per_rank_bytes["total"] < 60e9
    assert sharded.per_rank_bytes["optimizer"] == pytest.approx(2 * 4 * 9_399_951_360 / 8, rel=0.01)
    replicated = plan(load_config(preset="glm4-9b", nproc=8, check_here=False), 8, capacity_bytes=H200)
    assert replicated.fits is False and replicated.per_rank_bytes["params"] > 37e9
    assert any("switches.parallel.fsdp=8" in text for text in replicated.advice), replicated.advice
    assert any("fp32" in a for a in replicated.assumptions)


@pytest.mark.parametrize(("nproc", "overrides", "message"), [
    (4, ["switches.parallel.fsdp=3"], "fsdp=3 x tp=1 x pp=1 = 3 does not divide the world size 4"),
    (8, ["switches.parallel.tp=4"], "tp=4 does not divide num_key_value_heads=2"),
    (2, ["switches.parallel.pp=2", "switches.parallel.microbatches=3"], "microbatches=3 does not divide"),
    (6, ["switches.parallel.pp=3", "switches.parallel.microbatches=4"], "3 stages do not divide num_hidden_layers=2"),
    (2, ["switches.parallel.fsdp=2", "switches.param_sharing=all"], "cannot run with switches.param_sharing"),
    (2, ["switches.parallel.sequence_parallel=true"], "sequence_parallel=true splits the sequence over "
                                                      "tensor-parallel ranks: it needs tp > 1"),
    (2, ["switches.parallel.tp=2", "switches.parallel.sequence_parallel=true", "data.seq_len=63"],
     "sequence_parallel with tp=2 does not divide data.seq_len=63"),
])
def test_bad_layouts_are_refused_naming_the_degrees(nproc: int, overrides: list[str], message: str) -> None:
    preset = "glm4-9b" if "tp=4" in overrides[0] else "tiny"
    cfg = load_config(preset=preset, overrides=overrides, nproc=nproc, check_here=False)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        plan(cfg, nproc)
    assert err.value.key == "switches.parallel"
    if preset == "tiny":  # profile-run's own validation refuses it too, before any rank starts
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(preset=preset, overrides=overrides, nproc=nproc)


def test_the_command_prints_the_json_fields_and_exits_by_the_verdict() -> None:
    def glmperf_plan(*args: str) -> subprocess.CompletedProcess:
        code = "import sys; from profiler.cli import main; sys.exit(main(sys.argv[1:]))"
        return subprocess.run([sys.executable, "-c", code, "plan", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=120)

    done = glmperf_plan("--preset", "glm4-9b", "--nproc", "8", "--set", "switches.parallel.fsdp=8",
                        "--gpu", "h200", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out["per_rank_bytes"]) >= {"params", "grads", "optimizer", "activations", "total"}
    assert out["comm_bytes_per_step"]["total"] > 0 and out["fits"] is True
    assert glmperf_plan("--preset", "glm4-9b", "--nproc", "8", "--gpu", "h200").returncode == 1
    bad = glmperf_plan("--preset", "tiny", "--nproc", "3", "--set", "switches.parallel.fsdp=2")
    assert bad.returncode == 2 and "does not divide the world size 3" in bad.stderr


def test_training_refuses_what_the_trainer_cannot_run_though_plan_plans_it() -> None:
    for overrides, nproc, message in ((["switches.parallel.pp=2", "switches.grad_accumulation.steps=2"], 2,
                                       "raise switches.parallel.microbatches"),
                                      (["switches.parallel.tp=2", "switches.amp.dtype=fp16"], 4, "use amp=bf16")):
        assert plan(load_config(preset="tiny", overrides=overrides, nproc=nproc, check_here=False), nproc)
        with pytest.raises(ConfigError, match=message):
            load_config(preset="tiny", overrides=overrides, nproc=nproc)
