"""What a run says when it is stopped from outside: signals to the launcher or to one rank, and a
launcher killed outright; and that a profiled run prints only what glmperf means to say."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from profiler import store
from profiler.capture.ranks import Interrupted, RankRecord
from tests.conftest import ROOT, TINY, cli, glmperf, wait_for_steps

TWO_RANKS = ("--nproc", "2", "--steps", "2000", "--no-trace", *[f"--set={o}" for o in TINY])
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _processes_of(run_dir: Path) -> list[psutil.Process]:
    """The live processes started for `run_dir` (torchrun and its ranks: their command line names it)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if str(run_dir) in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def _gone_within(run_dir: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _processes_of(run_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture
def started(tmp_path: Path):
    """A 2-rank run whose steps are flowing: (launcher, run_dir). Whatever is left of it is killed after."""
    proc = cli(*TWO_RANKS, runs_dir=tmp_path, env=ENV)
    run_dir = wait_for_steps(tmp_path, 4)
    yield proc, run_dir
    for p in _processes_of(run_dir):  # what a failed test left training, before its pipes can close
        p.kill()
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=60)


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_torchrun_and_the_ranks_and_leaves_the_run_interrupted(started) -> None:
    proc, run_dir = started
    flushed = len(store.read_table(run_dir, "steps"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert _gone_within(run_dir, 5)
    record = store.read_run(run_dir)
    assert record["status"] == "interrupted" and [r["status"] for r in record["ranks"]] == ["interrupted"] * 2
    steps = store.read_table(run_dir, "steps")
    assert len(steps) >= flushed
    assert all(list(done) == list(range(len(done))) for _, done in steps.groupby("rank")["step"])


@pytest.mark.slow
def test_a_launcher_killed_outright_takes_its_ranks_with_it_and_finalize_says_so(started) -> None:
    proc, run_dir = started
    pid, flushed = proc.pid, len(store.read_table(run_dir, "steps"))
    proc.kill()
    proc.wait(timeout=10)
    assert _gone_within(run_dir, 30), "ranks still training after their launcher was killed"
    assert store.read_run(run_dir)["status"] == "incomplete"  # listed as killed, not `running`
    done = glmperf("finalize", str(run_dir), env=ENV)
    assert done.returncode == 1, done.stderr
    record = store.read_run(run_dir)
    assert record["status"] == "interrupted"
    assert record["error"] == f"its launcher (pid {pid}) died; the ranks stopped with it"
    assert len(store.read_table(run_dir, "steps")) >= flushed


@pytest.mark.slow
def test_a_signal_to_one_rank_names_that_rank_first_and_prints_no_traceback(started) -> None:
    proc, run_dir = started
    rank1 = next(s for s in store.read_rank_statuses(run_dir) if s["rank"] == 1)
    os.kill(rank1["pid"], signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    record = store.read_run(run_dir)
    # rank 0 loses its connection to rank 1, or torchrun stops it first: either way rank 1 is the cause
    assert re.fullmatch(r"rank 1 was stopped by SIGTERM; rank 0 (then lost its connection to it|was then stopped "
                        r"with it)", record["error"]), record["error"]
    assert proc.returncode == 130 and record["status"] == "interrupted"
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert "rank 1 was stopped by SIGTERM" in err and str(run_dir / store.LAUNCHER_LOG) in err
    assert "Root Cause (first observed failure)" in store.read_launcher_log(run_dir)


def _stopped(run_dir: Path, rank: int, error: BaseException) -> dict:
    RankRecord(run_dir, rank=rank, flush_interval_s=60, world_size=2).close(error)
    return next(s for s in store.read_rank_statuses(run_dir) if s["rank"] == rank)


def test_a_rank_stopped_after_its_peer_ended_names_the_peer_and_one_stopped_with_it_names_itself(
        tmp_path: Path) -> None:
    after, together = tmp_path / "after", tmp_path / "together"
    _stopped(after, 1, Interrupted("SIGTERM"))
    time.sleep(0.05)
    # torchrun stops the other ranks once one ended: that SIGTERM is a consequence, not the cause
    assert _stopped(after, 0, Interrupted("SIGTERM"))["error"] == (
        "rank 1 was stopped by SIGTERM; rank 0 was then stopped with it")
    both = Interrupted("SIGTERM"), Interrupted("SIGTERM")  # one signal to every rank, as a stopped launcher's
    time.sleep(0.05)
    _stopped(together, 1, both[1])
    assert _stopped(together, 0, both[0])["error"] == "rank 0 was stopped by SIGTERM"


NOISE = ("Memory block of unknown size", "USDT", "profiler_start", "profiler_stop")

TWO_TRACED_RUNS = """
import sys
from pathlib import Path
from profiler.capture.run import profile_run
from profiler.config import load_config
for _ in range(2):  # as a sweep or a verification does: several profiled runs in one process
    profile_run(load_config(preset="tiny", overrides=sys.argv[2:]), runs_dir=Path(sys.argv[1]), progress=False)
"""


def test_profiled_runs_print_none_of_torchs_profiler_noise(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", TWO_TRACED_RUNS, str(tmp_path), *TINY, "train.steps=5"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    runs = store.list_runs(tmp_path)
    assert len(runs) == 2 and all(r["status"] == "completed" for r in runs)
    assert all(store.trace_paths(Path(r["path"])) for r in runs)  # the window did profile, twice
    output = done.stdout + done.stderr
    assert not [line for line in output.splitlines() if any(n in line for n in NOISE)], output


FILTERED = """
import os
from profiler.instruments.torch_profiler import UNKNOWN_BLOCK, StderrFilter
quiet = StderrFilter(UNKNOWN_BLOCK)
os.write(2, b"before\\n[W1206 03:55:27.070695074 CPUAllocator.cpp:245] Memory block of unknown size was allocated "
            b"before the profiling started, profiler results will not include the deallocation event\\nafter")
quiet.close()
os.write(2, b" and on\\n")
"""


def test_the_stderr_filter_drops_that_line_alone() -> None:
    done = subprocess.run([sys.executable, "-c", FILTERED], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stderr == b"before\nafter and on\n"
