"""profile-run end to end: the run format, consistency of the figures, and every way a run can end."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from profiler import store
from profiler.config import load_config
from profiler.run import profile_run
from reference_model.trainer import StepRecord, TrainerHook

ROOT = Path(__file__).resolve().parent.parent
TINY = ["data.corpus=synthetic", "data.seq_len=32", "train.batch_size=4", "profile.trace_window=[1, 1, 2]",
        "profile.sample_hz=20", "profile.flush_interval_s=0.2", "profile.warmup_steps=1"]


def cli(*args: str, runs_dir: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "profiler.cli", "--preset", "tiny", "--no-progress",
                             "--runs-dir", str(runs_dir), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = load_config(preset="tiny", overrides=[*TINY, "train.steps=8"])
    return profile_run(cfg, runs_dir=tmp_path_factory.mktemp("runs"), progress=False)


def test_a_tiny_run_writes_every_file_of_the_format(tiny_run: Path) -> None:
    for name in ("run.json", "steps.parquet", "samples.parquet", "ops.parquet", "events.jsonl",
                 "traces/rank0.json.gz"):
        assert (tiny_run / name).exists(), name
    record = store.read_run(tiny_run)
    assert record["status"] == "completed" and record["schema_version"] == store.SCHEMA_VERSION
    s = record["summary"]
    for key in ("tokens_per_s", "peak_memory_bytes", "mfu"):
        assert s[key] > 0, key
    assert set(s["step_time_s"]) >= {"p50", "p90", "p99"}
    assert set(s["phase_share"]) >= {"data", "h2d", "forward", "backward", "optimizer", "comm"}
    assert record["environment"]["device"] and record["config"]["train"]["steps"] == 8
    assert record["sampling"]["source"] == "cpu" and "CUDA" in record["sampling"]["why"]


def test_the_figures_are_consistent(tiny_run: Path) -> None:
    steps = pd.read_parquet(tiny_run / "steps.parquet")
    assert list(steps["step"]) == list(range(8))
    phases = steps[[c for c in steps.columns if c.endswith("_s") and c not in ("step_s", "host_s",
                                                                                   "comm_time_s")]]
    assert (phases.sum(axis=1) - steps["step_s"]).abs().max() < 1e-6 * steps["step_s"].max() + 1e-9
    assert (steps["tokens"] == 4 * 32).all()
    s = store.read_run(tiny_run)["summary"]
    counted = steps[(steps["step"] >= 1) & ~steps["profiled"]]
    assert s["steps_counted"] == len(counted)
    assert s["tokens_per_s"] == pytest.approx(counted["tokens"].sum() / counted["step_s"].sum(), rel=1e-9)
    assert sum(s["phase_share"].values()) == pytest.approx(1.0, abs=1e-6)
    samples = pd.read_parquet(tiny_run / "samples.parquet")
    assert len(samples) >= 2 and samples["step"].max() >= 0


def test_the_trace_opens_and_holds_our_phases(tiny_run: Path) -> None:
    trace = json.loads(gzip.decompress((tiny_run / "traces" / "rank0.json.gz").read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"glmperf/forward", "glmperf/backward", "glmperf/optimizer"} <= names
    ops = pd.read_parquet(tiny_run / "ops.parquet")
    assert (ops["calls"] > 0).all() and ops["name"].str.contains("aten::").any()


class Crash(TrainerHook):
    def on_step_end(self, record: StepRecord) -> None:
        if record.step == 5:
            raise RuntimeError("induced failure at step 5")


def test_an_exception_leaves_failed_with_the_error_and_earlier_steps(tmp_path: Path) -> None:
    cfg = load_config(preset="tiny", overrides=[*TINY, "train.steps=50", "profile.trace=false"])
    run_dir = profile_run(cfg, runs_dir=tmp_path, progress=False, hooks=[Crash()])
    record = store.read_run(run_dir)
    assert record["status"] == "failed"
    assert "induced failure at step 5" in record["error"]
    assert "Traceback" in record["ranks"][0]["traceback"]
    # step 5 itself completed (the instruments saw it before the failing hook ran): 0..5 are stored
    assert list(store.read_table(run_dir, "steps")["step"]) == list(range(6))


def _wait_for_steps(runs_dir: Path, n: int, timeout: float = 120) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for run_dir in runs_dir.glob("*"):
            steps = store.read_table(run_dir, "steps") if (run_dir / "parts").exists() else pd.DataFrame()
            if len(steps) >= n:
                return run_dir
        time.sleep(0.2)
    raise AssertionError(f"no run reached {n} flushed steps in {timeout}s")


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, "interrupted"), (signal.SIGINT, "interrupted"),
                                            (signal.SIGKILL, "incomplete")])
def test_a_signal_keeps_what_was_measured(tmp_path: Path, sig: signal.Signals, status: str) -> None:
    proc = cli("--steps", "100000", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path)
    run_dir = _wait_for_steps(tmp_path, 3)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == {"interrupted": 130, "incomplete": -signal.SIGKILL}[status]
    record = store.read_run(run_dir)
    assert record["status"] == status
    steps = store.read_table(run_dir, "steps")
    assert len(steps) >= 3 and list(steps["step"]) == list(range(len(steps)))


def test_two_runs_started_at_once_never_collide(tmp_path: Path) -> None:
    procs = [cli("--steps", "3", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path,
                 env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(2)]
    for p in procs:
        p.communicate(timeout=180)
        assert p.returncode == 0
    runs = store.list_runs(tmp_path)
    assert len(runs) == 2 and all(r["status"] == "completed" for r in runs)
    assert all(len(store.read_table(Path(r["path"]), "steps")) == 3 for r in runs)


def test_bad_input_fails_before_the_run_directory_exists(tmp_path: Path) -> None:
    proc = cli("--set", "switches.amp=fp8", runs_dir=tmp_path / "runs")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "switches.amp.dtype" in err and "off, bf16, fp16" in err
    assert not (tmp_path / "runs").exists()


def test_two_gloo_ranks_write_per_rank_rows_and_communication(tmp_path: Path) -> None:
    proc = cli("--nproc", "2", "--steps", "6", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    (run,) = store.list_runs(tmp_path)
    assert run["status"] == "completed" and run["world_size"] == 2
    steps = store.read_table(Path(run["path"]), "steps")
    assert sorted(steps["rank"].unique()) == [0, 1]
    assert (steps.groupby("rank")["step"].apply(list) == [list(range(6))] * 2).all()
    assert (steps["comm_bytes"] > 0).all() and (steps["comm_calls"] > 0).all()
    s = run["summary"]
    assert s["comm"]["bytes_per_step"] > 0 and 0 <= s["comm"]["overlap_share"] <= 1
    assert s["straggler"]["slowest_rank"] in (0, 1)
    # the merged step is as slow as its slowest rank and counts both ranks' tokens
    counted = steps[steps["step"] >= 1].groupby("step").agg(step_s=("step_s", "max"), tokens=("tokens", "sum"))
    assert s["tokens_per_s"] == pytest.approx(counted["tokens"].sum() / counted["step_s"].sum(), rel=1e-9)


def test_a_rank_that_dies_fails_the_run_naming_it(tmp_path: Path) -> None:
    import psutil

    proc = cli("--nproc", "2", "--steps", "100000", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path)
    run_dir = _wait_for_steps(tmp_path, 4)
    ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
             if p.environ().get("RANK") == "1" and "profiler.run" in " ".join(p.cmdline())]
    assert ranks, "rank 1's process not found"
    ranks[0].kill()
    proc.communicate(timeout=120)
    assert proc.returncode == 1
    record = store.read_run(run_dir)
    assert record["status"] == "failed"
    assert record["error"].startswith("rank 1 failed")
    assert len(store.read_table(run_dir, "steps")) >= 4


def glmperf(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from profiler.cli import main; sys.exit(main())",
                           *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)


def test_init_run_then_ranks_then_finalize_as_on_several_nodes(tmp_path: Path) -> None:
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
