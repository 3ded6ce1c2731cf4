"""Advice on every kind of stored run, and what it leaves out: profile-run prints the top finding
and change under its table; diagnose reads runs that failed, were interrupted or killed, and runs
stored before diagnosis existed; a change the run already has, or that needs what the run lacks,
is never recommended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler import store
from profiler.advice.advise import advise
from profiler.advice.recommend import explore
from profiler.analysis import load_run
from tests.conftest import TINY, cli, copy_run, glmperf


def test_profile_run_prints_the_top_bottleneck_and_the_change_to_try(tmp_path: Path) -> None:
    proc = cli("--steps", "8", *[f"--set={o}" for o in TINY], "--set=data.io_delay_ms=20", "--name", "slow-reader",
               runs_dir=tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    (run,) = store.list_runs(tmp_path)
    top = run["diagnosis"]["recommendations"][0]
    assert f"diagnosis: {run['diagnosis']['verdict']}" in out
    assert run["diagnosis"]["verdict"].startswith("input_bound")
    assert f"try:       {top['command']}" in out and "switches.dataloader.num_workers=2" in top["command"]
    assert f"(all: glmperf recommend {run['id']})" in out


def test_the_top_recommendation_is_the_loader_fix_with_its_command(completed_run: Path) -> None:
    # modelled: what probes measure, and how they rank, is tests/test_probes.py's
    recs = json.loads(glmperf("recommend", str(completed_run), "--json", "--top", "1", "--probe-budget", "0"
                              ).stdout)["recommendations"]
    assert [r["set"] for r in recs] == [{"switches.dataloader.num_workers": 2}]
    assert recs[0]["command"] == (f"profile-run --from-run {completed_run} "
                                  "--set switches.dataloader.num_workers=2")


@pytest.mark.parametrize("kind", ["failed_run", "interrupted_run", "killed_run"])
def test_runs_that_did_not_complete_are_diagnosed_from_the_steps_they_flushed(
        kind: str, request: pytest.FixtureRequest) -> None:
    run_dir = request.getfixturevalue(kind)
    proc = glmperf("diagnose", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    fresh = json.loads(proc.stdout)
    assert fresh["verdict"] and isinstance(fresh["bottlenecks"], list)
    steps = fresh["figures"]["steps_counted"]["value"]
    assert 0 < steps <= len(store.read_table(run_dir, "steps"))


def test_a_run_stored_before_diagnosis_existed_is_diagnosed_from_its_measurements(
        completed_run: Path, tmp_path: Path) -> None:
    old = copy_run(completed_run, tmp_path)
    record = json.loads((old / "run.json").read_text())
    stored = record.pop("diagnosis")
    record.pop("shape_speedup", None)
    (old / "run.json").write_text(json.dumps(record))
    fresh = json.loads(glmperf("diagnose", str(old), "--json").stdout)
    # without the speedups measured at its shapes, the device's peak ratios stand in (and may
    # add a low-precision finding); what was measured reads the same
    (was,) = [b for b in stored["bottlenecks"] if b["kind"] == "input_bound"]
    (now,) = [b for b in fresh["bottlenecks"] if b["kind"] == "input_bound"]
    assert now["evidence"] == was["evidence"] and now["severity"] == was["severity"]


def test_what_the_run_already_does_or_cannot_use_is_never_recommended(completed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    advice = advise(load_run(run_dir))
    assert {"switches.dataloader.num_workers": 2} in [r["set"] for r in advice["recommendations"]]
    assert {"switch": "dataloader", "set": {"switches.dataloader.pin_memory": True},
            "reason": "needs cuda (the run's device)"} in advice["excluded"]
    config = store.read_run(run_dir)["config"]
    config["switches"]["dataloader"]["num_workers"] = 2
    store.update_run(run_dir, config=config)
    again = advise(load_run(run_dir))
    assert all("switches.dataloader.num_workers" not in r["set"] for r in again["recommendations"])
    assert all("switches.dataloader.num_workers" not in e["set"] for e in again["excluded"])


def test_exploring_a_run_ranks_what_makes_compute_faster_whatever_held_it_back(completed_run: Path) -> None:
    recs = explore(load_run(completed_run))["recommendations"]
    assert recs and all(r["for"] == "compute_bound" for r in recs)
    assert {"switches.compile.mode": "default"} in [r["set"] for r in recs]
    assert {"switches.dataloader.num_workers": 2} not in [r["set"] for r in recs]  # input, not compute
