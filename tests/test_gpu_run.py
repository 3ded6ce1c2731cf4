"""A real run measured on one NVIDIA H200 (`small`, bf16, 15 steps, by scripts/gpu_check.py), kept
without its traces and parts in tests/data/runs/h200-small-bf16: the GPU's figures as the run's own
trace gave them (summary.trace), its advice, and the capabilities read from its measurements, all
on a machine without a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from optimizers.vocabulary import Capability
from profiler import store
from profiler.advice.advise import advise
from profiler.advice.recommend import capabilities
from profiler.analysis import analyze, load_run

H200_RUN = Path(__file__).parent / "data" / "runs" / "h200-small-bf16"


@pytest.fixture
def h200_run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(H200_RUN, tmp_path / H200_RUN.name))


def test_host_bound_comes_from_the_gpu_idle_time_its_own_trace_shows(h200_run: Path) -> None:
    advice = advise(load_run(h200_run))
    top = advice["bottlenecks"][0]
    assert top["kind"] == "host_bound"
    rank0 = store.read_run(h200_run)["summary"]["trace"]["ranks"]["0"]
    assert top["evidence"]["gpu_idle"]["value"] == pytest.approx(100 * rank0["temporal"]["idle_share"])
    assert top["evidence"]["host_wait"]["value"] == pytest.approx(100 * rank0["idle"]["host_wait_share"])
    assert top["evidence"]["gpu_idle"]["value"] > 90  # 15 steps of a small model leave an H200 idle
    assert [r["set"] for r in advice["recommendations"]][0] == {"switches.compile.mode": "default"}


def test_fp16_is_not_worth_its_scaler_where_bf16_runs_as_fast(h200_run: Path) -> None:
    run = load_run(h200_run)
    caps = capabilities(run, analyze(run))
    assert caps[Capability.FAST_BF16_MATMUL][0] and caps[Capability.FAST_FP16_MATMUL][0]
    assert not caps[Capability.FP16_OVER_BF16][0], caps[Capability.FP16_OVER_BF16][1]
