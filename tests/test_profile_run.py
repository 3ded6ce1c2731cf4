"""profile-run end to end: the run format, consistency of the figures, and every way a run can end."""

from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from profiler import store
from profiler.capture import launch
from profiler.capture import run as run_module
from profiler.config import load_config
from profiler.metrics import PHASE_COLUMNS, PHASE_NAMES
from tests.conftest import ROOT, TINY, cli, glmperf, wait_for_steps


def test_a_tiny_run_writes_every_file_of_the_format(completed_run: Path) -> None:
    for name in ("run.json", "steps.parquet", "samples.parquet", "ops.parquet", "events.jsonl",
                 "traces/rank0.json.gz"):
        assert (completed_run / name).exists(), name
    record = store.read_run(completed_run)
    assert record["status"] == "completed" and record["schema_version"] == store.SCHEMA_VERSION
    assert set(record["summary"]["phase_share"]) == set(PHASE_NAMES)
    assert record["environment"]["device"] == "cpu" and record["config"]["train"]["steps"] == 8
    assert record["environment"]["world_size"] == record["world_size"] == 1
    assert record["sampling"]["source"] == "cpu" and "CUDA" in record["sampling"]["why"]
    assert record["peak"]["dtype"] == "fp32" and record["summary"]["peak_dtype"] == "fp32"


def test_the_figures_are_what_the_rows_say(completed_run: Path) -> None:
    steps = pd.read_parquet(completed_run / "steps.parquet")
    assert list(steps["step"]) == list(range(8)) and (steps["tokens"] == 4 * 32).all()
    assert np.allclose(steps[list(PHASE_COLUMNS)].sum(axis=1), steps["step_s"], rtol=1e-9)
    record = store.read_run(completed_run)
    s = record["summary"]
    counted = steps[(steps["step"] >= 1) & ~steps["profiled"]]  # warmup_steps=1, trace window excluded
    assert s["steps_counted"] == len(counted) == 8 - 1 - 3
    assert s["tokens_per_s"] == pytest.approx(counted["tokens"].sum() / counted["step_s"].sum(), rel=1e-12)
    assert s["step_time_s"]["p50"] == pytest.approx(float(np.median(counted["step_s"])), rel=1e-12)
    for phase, column in zip(PHASE_NAMES, PHASE_COLUMNS, strict=True):
        assert s["phase_share"][phase] == pytest.approx(counted[column].sum() / counted["step_s"].sum(), rel=1e-9)
    assert s["peak_memory_bytes"] == steps["rss_peak_bytes"].max()
    flops = record["model"]["flops_per_token"] * s["tokens_per_s"]
    assert s["mfu"] == pytest.approx(flops / record["peak"]["flops"], rel=1e-12)
    assert s["loss_first"] == steps["loss"].iloc[0] and s["loss_last"] == steps["loss"].iloc[-1]


def test_the_trace_opens_and_holds_our_phases(completed_run: Path) -> None:
    trace = json.loads(gzip.decompress((completed_run / "traces" / "rank0.json.gz").read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"glmperf/forward", "glmperf/backward", "glmperf/optimizer"} <= names
    ops = pd.read_parquet(completed_run / "ops.parquet")
    assert (ops["calls"] > 0).all() and ops["name"].str.contains("aten::").any()


def test_an_exception_leaves_failed_with_the_error_and_earlier_steps(failed_run: Path) -> None:
    record = store.read_run(failed_run)
    assert record["status"] == "failed"
    assert record["error"] == "rank 0 failed: RuntimeError: induced failure at step 5 [/bold] [process RSS (CPU)]"
    assert "Traceback" in record["ranks"][0]["traceback"]
    # step 5 itself completed (the instruments saw it before the failing hook ran): 0..5 are stored
    assert list(store.read_table(failed_run, "steps")["step"]) == list(range(6))


def test_ctrl_c_leaves_interrupted_with_every_step_before_it(interrupted_run: Path) -> None:
    record = store.read_run(interrupted_run)
    assert record["status"] == "interrupted" and record["error"] == "induced Ctrl-C"
    assert list(store.read_table(interrupted_run, "steps")["step"]) == list(range(5))


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, "interrupted"), (signal.SIGINT, "interrupted")])
def test_a_signal_keeps_what_was_measured(tmp_path: Path, sig: signal.Signals, status: str) -> None:
    proc = cli("--steps", "100000", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path)
    run_dir = wait_for_steps(tmp_path, 3)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    record = store.read_run(run_dir)
    assert record["status"] == status
    steps = store.read_table(run_dir, "steps")
    assert len(steps) >= 3 and list(steps["step"]) == list(range(len(steps)))
    assert record["summary"]["steps_counted"] == len(steps) - 1


def test_a_killed_run_is_incomplete_with_its_flushed_steps(killed_run: Path) -> None:
    assert store.read_run(killed_run)["status"] == "incomplete"
    steps = store.read_table(killed_run, "steps")
    assert len(steps) >= 4 and list(steps["step"]) == list(range(len(steps)))


@pytest.mark.slow
def test_two_runs_started_at_once_never_collide(tmp_path: Path) -> None:
    procs = [cli("--steps", "3", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path,
                 env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(2)]
    for p in procs:
        p.communicate(timeout=180)
        assert p.returncode == 0
    runs = store.list_runs(tmp_path)
    assert len(runs) == 2 and all(r["status"] == "completed" for r in runs)
    assert all(len(store.read_table(Path(r["path"]), "steps")) == 3 for r in runs)


def test_a_failure_of_the_launcher_itself_is_the_runs_error(tmp_path: Path, monkeypatch) -> None:
    def cannot_start(*args, **kwargs):
        raise FileNotFoundError("[Errno 2] No such file or directory: 'torchrun'")

    monkeypatch.setattr(run_module, "launch_ranks", cannot_start)
    run_dir = run_module.profile_run(load_config(preset="tiny", overrides=TINY, nproc=2), runs_dir=tmp_path, nproc=2,
                                     progress=False)
    record = store.read_run(run_dir)
    assert record["status"] == "failed"
    assert record["error"] == ("the launch failed before any rank started: FileNotFoundError: [Errno 2] No such "
                               "file or directory: 'torchrun'")


def test_torchruns_failure_report_names_the_root_cause() -> None:
    report = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 3568)  (SIGTERM)
  traceback : Signal 15 (SIGTERM) received by PID 3568
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_11:53:51
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 3569)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 3569
======================================================"""
    assert launch.torchrun_root_cause(report) == (
        "rank 1 (local_rank: 1) exited with code -9 (pid: 3569)  (SIGKILL): Signal 9 (SIGKILL) received by PID 3569")
    assert launch.torchrun_root_cause("======\n") is None


def test_bad_input_fails_before_the_run_directory_exists(tmp_path: Path) -> None:
    proc = cli("--set", "switches.amp=fp8", runs_dir=tmp_path / "runs")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "switches.amp.dtype" in err and "off, bf16, fp16" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_two_gloo_ranks_write_per_rank_rows_and_communication(two_rank_run: Path) -> None:
    run = store.read_run(two_rank_run)
    assert run["status"] == "completed" and run["world_size"] == run["environment"]["world_size"] == 2
    steps = store.read_table(two_rank_run, "steps")
    assert sorted(steps["rank"].unique()) == [0, 1]
    assert (steps.groupby("rank")["step"].apply(list) == [list(range(6))] * 2).all()
    assert (steps["comm_bytes"] > 0).all() and (steps["comm_calls"] > 0).all()
    s = run["summary"]
    assert s["comm"]["bytes_per_step"] == steps[steps["step"] >= 1]["comm_bytes"].mean()
    assert 0 <= s["comm"]["overlap_share"] <= 1 and s["straggler"]["slowest_rank"] in (0, 1)
    # the merged step is as slow as its slowest rank and counts both ranks' tokens
    counted = steps[steps["step"] >= 1].groupby("step").agg(step_s=("step_s", "max"), tokens=("tokens", "sum"))
    assert s["tokens_per_s"] == pytest.approx(counted["tokens"].sum() / counted["step_s"].sum(), rel=1e-12)
    # the ranks share this machine's CPU: MFU divides by one host's peak
    assert s["devices"] == 1


def _rank_processes(proc_pid: int, rank: str) -> list[psutil.Process]:
    return [p for p in psutil.Process(proc_pid).children(recursive=True)
            if p.environ().get("RANK") == rank and "profiler.run" in " ".join(p.cmdline())]


@pytest.mark.slow
def test_a_rank_that_dies_fails_the_run_naming_it_and_why(tmp_path: Path) -> None:
    proc = cli("--nproc", "2", "--steps", "100000", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path)
    run_dir = wait_for_steps(tmp_path, 4)
    ranks = _rank_processes(proc.pid, "1")
    assert ranks, "rank 1's process not found"
    ranks[0].kill()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    record = store.read_run(run_dir)
    assert record["status"] == "failed"
    assert record["error"].startswith("rank 1 failed: it died without reporting a status (rank 1 ")
    assert "exited with code -9" in record["error"] and "SIGKILL" in record["error"]
    steps = store.read_table(run_dir, "steps")
    assert len(steps) >= 4
    # steps only the surviving rank finished are left out of the summary, and it says so
    complete = steps.groupby("step")["rank"].nunique() == 2
    assert record["summary"]["steps_total"] == int(complete.sum())
    assert any("fewer than all 2 ranks" in n for n in record["summary"]["notes"]) or complete.all()
    assert "rank 1 failed" in out  # the summary table prints, whatever the error holds


@pytest.mark.slow
def test_a_killed_torchrun_agent_fails_the_run_and_stops_its_ranks(tmp_path: Path) -> None:
    proc = cli("--nproc", "2", "--steps", "100000", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path)
    run_dir = wait_for_steps(tmp_path, 4)
    ranks = _rank_processes(proc.pid, "0") + _rank_processes(proc.pid, "1")
    (agent,) = [p for p in psutil.Process(proc.pid).children() if "torch.distributed.run" in " ".join(p.cmdline())]
    agent.kill()
    proc.communicate(timeout=120)
    assert proc.returncode == 1
    record = store.read_run(run_dir)
    assert record["status"] == "failed" and "torchrun agent was killed by SIGKILL" in record["error"]
    assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_init_run_then_ranks_then_finalize_as_on_several_nodes(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    init = glmperf("init-run", "--preset", "tiny", "--nproc", "2", "--runs-dir", str(tmp_path),
                   *[f"--set={o}" for o in TINY], "--set=train.steps=4", "--set=profile.trace=false", env=env)
    assert init.returncode == 0, init.stderr
    run_dir = Path(init.stdout.strip())
    assert store.read_run(run_dir)["status"] == "running"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    "-m", "profiler.run", "--run-dir", str(run_dir), "--no-progress"],
                   cwd=ROOT, check=True, capture_output=True, env=env, timeout=240)
    assert len(store.read_table(run_dir, "steps")) == 8  # readable from the parts before finalize
    done = glmperf("finalize", str(run_dir), env=env)
    assert done.returncode == 0, done.stderr
    record = store.read_run(run_dir)
    assert record["status"] == "completed" and record["summary"]["comm"]["bytes_per_step"] > 0
    assert record["peak"]["dtype"] == "fp32"  # measured at finalize: no launcher of ours measured it
