"""The one ending (profiler.capture.finish.finalize): a tiny profile-run, an import of its trace and a run of
one's own loop each end through it, with run.json written once; a reading that fails costs the run nothing
that was measured before it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import CodeType
from typing import Any

import pytest
import torch

from profiler import api, store
from profiler.capture import finish
from profiler.cli import main
from tests.conftest import linear_steps, tiny_run

QUICK = {"trace_window": [1, 1, 2], "sample_hz": 20, "flush_interval_s": 0.2, "warmup_steps": 1}
"""Profile settings that keep an API run short."""


@pytest.fixture
def run_json_writes(monkeypatch: pytest.MonkeyPatch) -> list[CodeType]:
    """Each write of a run.json from now on, as the code of the function that made it."""
    writes: list[CodeType] = []
    real = store.write_json_atomic

    def counting(path: Path, data: Any) -> None:
        if path.name == "run.json":
            writes.append(sys._getframe(1).f_code)
        real(path, data)

    monkeypatch.setattr(store, "write_json_atomic", counting)
    return writes


def _own_loop(runs_dir: Path) -> Path:
    """A real run of a user's loop through profiler.api; its directory."""
    model = torch.nn.Linear(16, 16)
    with api.run(name="own", runs_dir=runs_dir, model=model, profile=QUICK) as run:
        linear_steps(run, model, 5)
    assert run.dir is not None
    return run.dir


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
def test_every_source_ends_through_finalize_writing_run_json_once(
        tmp_path: Path, run_json_writes: list[CodeType], capsys: pytest.CaptureFixture[str]) -> None:
    ended_once = [store.create_run.__code__, finish.finalize.__code__]  # created `running`, then ended
    profiled = tiny_run(tmp_path / "profiled", "train.steps=5", "name=profiled")
    assert run_json_writes == ended_once
    run_json_writes.clear()
    shutil.copytree(profiled / "traces", tmp_path / "traces")  # a real trace: the tiny run's own
    assert main(["import", str(tmp_path / "traces"), "--runs-dir", str(tmp_path / "imported")]) == 0
    assert run_json_writes == ended_once
    run_json_writes.clear()
    own = _own_loop(tmp_path / "own")
    assert run_json_writes == ended_once
    (imported,) = (tmp_path / "imported").iterdir()
    for run_dir, source in ((profiled, None), (imported, "import"), (own, "api")):
        record = store.read_run(run_dir)
        assert record.get("source") == source and record["status"] == "completed" and record["ended"]
        assert record["summary"]["steps_counted"] > 0 and "error" not in record["diagnosis"]
    assert store.read_run(imported)["summary"]["trace"]["ranks"]["0"]["steps"] == 2
    assert "shape_speedup" not in store.read_run(imported)  # nothing of an import ran here
    assert store.read_run(own)["model"]["class"] == "torch.nn.modules.linear.Linear"


def test_a_failed_diagnosis_keeps_the_status_and_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         run_json_writes: list[CodeType]) -> None:
    def cannot_advise(run: Any) -> dict[str, Any]:
        raise RuntimeError("no advice today")

    monkeypatch.setattr(finish, "advise", cannot_advise)
    record = store.read_run(tiny_run(tmp_path, "train.steps=4", "profile.trace=false"))
    assert record["status"] == "completed" and record["error"] is None and len(record["ranks"]) == 1
    assert record["summary"]["steps_counted"] > 0 and "shape_speedup" in record
    assert record["diagnosis"] == {"error": "RuntimeError: no advice today"}
    assert run_json_writes == [store.create_run.__code__, finish.finalize.__code__]


def test_a_failed_summary_keeps_the_status_and_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot_summarize(run: Any) -> dict[str, Any]:
        raise RuntimeError("no summary today")

    monkeypatch.setattr(finish, "summarize", cannot_summarize)
    with pytest.raises(RuntimeError, match="no summary today"):
        tiny_run(tmp_path, "train.steps=4", "profile.trace=false")
    (run_dir,) = (p for p in tmp_path.iterdir() if p.is_dir())
    record = store.read_run(run_dir)
    assert record["status"] == "completed" and record["ended"] and len(record["ranks"]) == 1
    assert record["model"]["num_params"] > 0 and "summary" not in record and "diagnosis" not in record
    assert len(store.read_table(run_dir, "steps")) == 4  # every step, compacted
