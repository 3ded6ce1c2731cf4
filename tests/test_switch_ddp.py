"""The ddp switch on real torchrun ranks over gloo, its config-time checks, and the checkpoint switch.

One torchrun launch (tests/ddp_worker.py) trains every scenario on 2 ranks and the tests below read
its per-rank JSON; a second launch kills a rank mid-run. The tiny model's 132,160 parameters are
528,640 bytes of fp32 gradients; 0.1 MB buckets split them into several all-reduces.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from optimizers import Bottleneck, ConfigError, SwitchesConfig, TrainSetup, check_all
from optimizers.base import Registry
from optimizers.checkpointing import OPTIMIZATION as CHECKPOINT
from optimizers.checkpointing import CheckpointConfig, apply_checkpointing
from optimizers.config import build_section
from optimizers.ddp import TIMEOUT_ENV, DdpConfig, apply_ddp, gloo_all_reduces
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.model import GLMForCausalLM
from reference_model.trainer import Trainer
from tests.contexts import context

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "ddp_worker.py"
STEPS = 4
SMALL = 0.1  # MB per bucket
BF16_OVER_GLOO = gloo_all_reduces(torch.bfloat16)
HOOKS = ["none", "fp16", "powersgd"] + (["bf16"] if BF16_OVER_GLOO else [])


def _scenario(name: str, switches: dict[str, Any], batch_size: int = 2, record: bool = True) -> dict[str, Any]:
    return {"name": name, "switches": switches, "steps": STEPS, "batch_size": batch_size, "record": record}


SCENARIOS = [
    _scenario("default", {}),  # what `torchrun ... profile-run` gets without any ddp key
    *[_scenario(hook, {"ddp": {"comm_hook": hook, "bucket_cap_mb": SMALL}}) for hook in HOOKS],
    _scenario("accumulate", {"ddp": {"bucket_cap_mb": SMALL}, "grad_accumulation": 2}),
    # torch's hook registered bare (no profiler); bf16's is renamed past DDP's by-name refusal
    _scenario("unrecorded", {"ddp": {"comm_hook": HOOKS[-1], "bucket_cap_mb": SMALL}}, record=False),
]


def torchrun(out: Path, scenarios: list[dict[str, Any]], *, worker: Path = WORKER, nproc: int = 2,
             **env: str) -> tuple[int, str]:
    """Launch `worker` on `nproc` gloo ranks: (exit code, output). A hang fails the test after the
    timeout, with the whole launch (agent and workers, its own session) killed, not left behind."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                TIMEOUT_ENV: "30", **env}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(worker), str(out), json.dumps(scenarios)]
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun still running after 120 s:\n{output[-4000:]}")
    return proc.returncode, output


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each rank's results by scenario name."""
    out = tmp_path_factory.mktemp("ddp")
    code, output = torchrun(out, SCENARIOS)
    if code != 0:
        pytest.fail(f"torchrun exited {code}:\n{output[-4000:]}")
    return [json.loads((out / f"rank{r}.json").read_text())["results"] for r in (0, 1)]


def tiny_gradient_numel() -> tuple[int, int]:
    """(all gradient elements, elements PowerSGD rank 1 sends: P and Q of each matrix it compresses
    (where (n + m) * 2 < n * m, torch's default min_compression_rate) and every other tensor whole)."""
    total = compressed = 0
    for p in GLMForCausalLM(model_config("tiny")).parameters():
        total += p.numel()
        n, m = p.shape[0], p.numel() // p.shape[0]
        compressed += n + m if p.dim() > 1 and (n + m) * 2 < n * m else p.numel()
    return total, compressed


class Losses(TrainerHook):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_step_end(self, record: StepRecord) -> None:
        self.values.append(float(record.loss))


def test_two_ranks_of_batch_2_train_like_one_process_of_batch_4(ranks: list[dict], tmp_path: Path) -> None:
    losses = Losses()
    Trainer(model_cfg=model_config("tiny"), data_cfg=DataConfig(corpus=["synthetic"], seq_len=32),
            train_cfg=TrainConfig(batch_size=4, steps=STEPS, device="cpu"),
            switches=build_section(SwitchesConfig, {}, "switches"), hooks=[losses], run_dir=tmp_path).fit()
    r0, r1 = (r["default"] for r in ranks)
    assert r0["wrapped"] and r1["wrapped"], \
        "DDP was not applied at default switches on 2 ranks: the ddp record must say always=True"
    per_rank = [[s["loss"] for s in r["steps"]] for r in (r0, r1)]
    assert per_rank[0][0] != pytest.approx(per_rank[1][0], abs=1e-3)  # each rank sees its own half
    mean = [(a + b) / 2 for a, b in zip(*per_rank, strict=True)]
    assert mean == pytest.approx(losses.values, abs=1e-4)


def test_comm_hooks_cut_the_bytes_each_step_sends(ranks: list[dict]) -> None:
    total, powersgd = tiny_gradient_numel()
    start = max(2, STEPS // 10)  # PowerSGD's plain all-reduce steps
    for results in ranks:
        for hook in HOOKS:
            for step, s in enumerate(results[hook]["steps"]):
                comm = s["comm"]
                expected = {"none": 4 * total, "fp16": 2 * total, "bf16": 2 * total,
                            "powersgd": 4 * (powersgd if step >= start else total)}[hook]
                assert comm["bytes"] == expected, (hook, step)
                calls_per_bucket = 3 if hook == "powersgd" and step >= start else 1
                assert comm["calls"] == calls_per_bucket * comm["buckets"], (hook, step)
                assert comm["time_s"] > 0 and 0 <= comm["exposed_s"] <= comm["time_s"], (hook, step)
                assert comm["bandwidth"] == pytest.approx(comm["bytes"] / comm["time_s"])
        # DDP rebuilds its buckets after the first step; from then on the 0.1 MB cap holds, except
        # for PowerSGD, which gloo can only run as one bucket (optimizers.ddp.bucket_cap_mb).
        assert results["none"]["steps"][-1]["comm"]["buckets"] > 1
        assert {s["comm"]["buckets"] for s in results["powersgd"]["steps"]} == {1}
        assert any("PowerSGD over gloo needs one bucket" in note for note in results["powersgd"]["notes"])
    assert 4 * powersgd < 4 * total / 20


def test_accumulation_all_reduces_only_the_last_micro_batch(ranks: list[dict]) -> None:
    for results in ranks:
        accumulated, plain = results["accumulate"]["steps"], results["none"]["steps"]
        assert [s["micro_batches"] for s in accumulated] == [2] * STEPS
        for step in range(1, STEPS):  # step 0 runs DDP's initial buckets, rebuilt after it
            assert accumulated[step]["comm"]["calls"] == plain[step]["comm"]["calls"] > 1
            assert accumulated[step]["comm"]["bytes"] == plain[step]["comm"]["bytes"]


def test_recording_the_all_reduces_changes_no_loss(ranks: list[dict]) -> None:
    for results in ranks:
        bare, recorded = results["unrecorded"], results[HOOKS[-1]]
        assert bare["wrapped"] and all(s["comm"] is None for s in bare["steps"])
        assert [s["loss"] for s in bare["steps"]] == [s["loss"] for s in recorded["steps"]]


def test_a_dead_rank_fails_the_launch_and_is_named(tmp_path: Path) -> None:
    code, output = torchrun(tmp_path, [_scenario("none", {"ddp": {"bucket_cap_mb": SMALL}})],
                            GLMPERF_TEST_DIE_RANK="1", GLMPERF_TEST_DIE_STEP="2")
    assert code != 0
    root = output[output.index("Root Cause"):]
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s+exitcode\s*:\s*3\b", root), output[-3000:]
    assert not list(tmp_path.glob("rank*.json"))


def test_a_silent_rank_times_the_others_out(tmp_path: Path) -> None:
    """Rank 1 hangs without exiting: rank 0's all-reduce gives up after GLMPERF_DIST_TIMEOUT_S and
    fails the launch (the agent then ends rank 1) instead of waiting forever."""
    code, output = torchrun(tmp_path, [_scenario("none", {"ddp": {"bucket_cap_mb": SMALL}})],
                            GLMPERF_TEST_DIE_RANK="1", GLMPERF_TEST_DIE_STEP="2", GLMPERF_TEST_HANG="1",
                            **{TIMEOUT_ENV: "3"})
    assert code != 0
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)\s+exitcode\s*:\s*1\b", output[output.index("Root Cause"):])
    assert "Timed out" in output, output[-3000:]


# --------------------------------------------------------------------------------------------
# In-process: checks, the single-process path, the checkpoint switch


@pytest.mark.parametrize(("ddp", "world_size", "reason"), [
    ("fp16", 1, "comm_hook=fp16 needs several ranks: run with --nproc N / torchrun"),
    ("powersgd", 1, "comm_hook=powersgd needs several ranks"),
    ({"backend": "nccl"}, 2, "backend=nccl needs CUDA"),
])
def test_checks_refuse_what_cannot_run_here(ddp: Any, world_size: int, reason: str) -> None:
    if reason.startswith("backend=nccl") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    switches = build_section(SwitchesConfig, {"ddp": ddp}, "switches")
    with pytest.raises(ConfigError, match=re.escape(reason)) as err:
        check_all(switches, context(world_size=world_size))
    assert err.value.key == "switches.ddp"


def test_bad_timeout_is_refused_at_config_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match=f"{TIMEOUT_ENV}: got 'soon'"):
        check_all(SwitchesConfig(), context(world_size=2))
    check_all(SwitchesConfig(), context(world_size=1))  # one process never waits on a peer


def test_bf16_hook_follows_what_gloo_can_all_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gloo_all_reduces(torch.float32)
    bf16 = build_section(SwitchesConfig, {"ddp": "bf16"}, "switches")
    ctx = context(world_size=2)
    if BF16_OVER_GLOO:
        check_all(bf16, ctx)  # and the 2-rank launch ran the bf16 scenario
    monkeypatch.setattr("optimizers.ddp.gloo_all_reduces", lambda dtype: dtype != torch.bfloat16)
    with pytest.raises(ConfigError, match=r"gloo in torch .* cannot all-reduce torch.bfloat16"):
        check_all(bf16, ctx)


def test_one_process_is_left_alone() -> None:
    model = GLMForCausalLM(model_config("tiny"))
    setup = TrainSetup(model=model)
    apply_ddp(setup, DdpConfig(), context(world_size=1))
    assert setup.model is model and setup.no_sync is None and setup.notes == []


def test_checkpoint_switch_notes_its_policy_and_registers() -> None:
    setup = TrainSetup(model=GLMForCausalLM(model_config("tiny")))
    apply_checkpointing(setup, CheckpointConfig(every=50, keep=2, resume=True), context())
    assert setup.notes == ["checkpoint: save every 50 steps on rank 0, keep the last 2; "
                           "dir <run dir>/checkpoints; resume from the newest good checkpoint"]
    Registry().register(CHECKPOINT)
    assert CHECKPOINT.addresses == (Bottleneck.CHECKPOINT_BOUND,)
    assert CHECKPOINT.enabled(CheckpointConfig(every=10)) and not CHECKPOINT.enabled(CheckpointConfig())
