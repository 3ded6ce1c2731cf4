"""Traces of PyTorch 1.8-1.9 (the TensorBoard plugin's ResNet-50 samples, tests/data/traces_public) import
with their steps and phases.

Their categories are the old ones (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`) and autograd's
backward nodes carry no `autograd::engine::evaluate_function` wrapper: read as they were, the import had
0 steps, so no diagnosis, where the plugin itself reported the DataLoader at 33% and advised workers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.cli import main

SAMPLES = Path(__file__).parent / "data" / "traces_public" / "tb_plugin_resnet50"


def _imported(workers: int, runs: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["import", str(SAMPLES / f"num_workers_{workers}"), "--runs-dir", str(runs), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_loader_without_workers_is_input_bound_with_its_steps_and_backward(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _imported(0, tmp_path, capsys)
    summary = out["summary"]
    assert summary["steps_counted"] == 6  # ProfilerStep#5 to #10
    shares = summary["phase_share"]
    assert shares["backward"] > 0.10 and shares["forward"] > 0.10 and shares["optimizer"] > 0.05
    top = out["diagnosis"]["bottlenecks"][0]
    assert top["kind"] == "input_bound" and 0.30 < top["severity"] < 0.50, top


def test_four_workers_take_the_wait_away(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _imported(4, tmp_path, capsys)
    assert out["summary"]["steps_counted"] > 0
    assert out["summary"]["phase_share"]["data"] < 0.05
    assert "input_bound" not in [b["kind"] for b in out["diagnosis"]["bottlenecks"]]

