"""A trace made here by plain torch.profiler on CPU (tensorboard_trace_handler) imports with the
CPU-side breakdown: HTA cannot read such a trace (it has no GPU events); glmperf must."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from profiler.analysis import load_run
from profiler.cli import main
from profiler.traces import trace_summary
from tests.conftest import tiny_run

ACTIVE = 3


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's own loop: a DataLoader, a small MLP, SGD, profiled for ACTIVE steps."""
    out = tmp_path_factory.mktemp("tb")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randn(512, 8)),
                                       batch_size=32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=ACTIVE), on_trace_ready=tensorboard_trace_handler(str(out))
                 ) as prof:
        for step, (x, y) in enumerate(data):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
            if step == 1 + 1 + ACTIVE:
                break
    assert list(out.glob("*.pt.trace.json"))
    return out


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
def test_cpu_trace_imports_with_the_cpu_breakdown(trace_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(trace_dir), "--runs-dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "import" and out["failed"] == []
    run = load_run(out["path"])
    assert run.record["environment"]["device"] == "cpu"
    steps = run.steps
    assert len(steps) == ACTIVE and steps["rank"].eq(0).all()
    for phase in ("forward_s", "backward_s", "optimizer_s", "data_s"):
        assert (steps[phase] > 0).all(), phase
    assert (steps["comm_s"] == 0).all()  # nothing communicated in one process
    shares = out["summary"]["phase_share"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["forward"] + shares["backward"] > 0.2
    ops = run.ops.set_index(["name", "input_shapes"])
    assert ops.loc[("aten::addmm", "[[256], [32, 64], [64, 256], [], []]"), "calls"] == ACTIVE
    assert (run.ops["self_device_s"] == 0).all() and run.kernels.empty
    trace = out["summary"]["trace"]["ranks"]["0"]
    assert trace["steps"] == ACTIVE and "temporal" not in trace  # no GPU: no GPU breakdown
    assert main(["diagnose", out["path"]]) == 0  # the CPU rules run on it


def test_profile_runs_own_traces_get_the_same_analysis(tmp_path: Path) -> None:
    """trace_summary reads a profile-run's traces/rank<r>.json.gz as import reads any trace."""
    run_dir = tiny_run(tmp_path, "train.steps=5")
    summary = trace_summary(run_dir)
    assert list(summary["ranks"]) == ["0"]
    assert summary["ranks"]["0"]["steps"] == 2  # the active steps of trace_window [1, 1, 2]
    assert "temporal" not in summary["ranks"]["0"]  # a CPU run: no GPU events
