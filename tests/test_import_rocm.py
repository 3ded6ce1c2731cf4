"""A ROCm trace (MI300X, HIP runtime calls) imports with its launch statistics, as HTA reads them.

Kineto names ROCm's launch calls `hipLaunchKernel`, `hipExtModuleLaunchKernel` and
`hipModuleLaunchKernel`; statistics that paired only CUDA's calls read NaN on every AMD trace and
printed "nan%" in host-bound verdicts. The trace here is written in kineto's chrome format: one
kernel per step, each launched by another of the three calls, 30 us of call for 20 us of kernel.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.cli import main

LAUNCHES = ("hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel")


def _rocm_trace(path: Path) -> None:
    events = []
    for step, launch in enumerate(LAUNCHES):
        t = step * 1000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t,
             "dur": 1000},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 10, "dur": 100},
            {"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": 1, "tid": 1, "ts": t + 20, "dur": 30,
             "args": {"correlation": step + 1}},
            {"ph": "X", "cat": "kernel", "name": "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32", "pid": 0, "tid": 7,
             "ts": t + 70, "dur": 20, "args": {"correlation": step + 1, "stream": 7, "device": 0}}]
    path.write_text(json.dumps({"deviceProperties": [{"name": "AMD Instinct MI300X"}], "traceEvents": events}))


def test_rocm_launch_calls_give_launch_statistics_and_a_host_bound_verdict_without_nan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rocm_trace(tmp_path / "rank-0.json")
    assert main(["import", str(tmp_path / "rank-0.json"), "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    rank = json.loads(capsys.readouterr().out)["summary"]["trace"]["ranks"]["0"]
    # HTA leaves the last of several steps out: the first two launches count
    assert rank["launches"] == 2 and rank["launch_delay_us"]["p50"] == 20.0  # 70 - (20 + 30)
    assert rank["short_kernel_share"] == 1.0  # 20 us kernels from 30 us calls
    assert main(["diagnose", "rank-0", "--runs-dir", str(tmp_path / "runs")]) == 0
    verdict = capsys.readouterr().out.splitlines()[0]
    assert "host_bound" in verdict and "median launch delay 20 us" in verdict and "nan" not in verdict
