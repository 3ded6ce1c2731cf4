"""Real stored runs, made once per test session, for every test that reads runs.

Each fixture is a real `tiny` run of the real trainer and instruments, stored by the real store:
completed, failed (an exception in a hook), interrupted (Ctrl-C in a hook), two gloo ranks under
torchrun, killed with SIGKILL mid-run, and a copy of a live run's directory (its flushed parts,
taken mid-run). Tests must not modify them: copy a fixture's directory first (`copy_run`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from profiler import api, store
from profiler.capture.run import profile_run
from profiler.config import load_config
from reference_model.hooks import StepRecord, TrainerHook

ROOT = Path(__file__).resolve().parent.parent
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # a suite started as a background job inherits SIGINT ignored, and so would every run it starts:
    # the Ctrl-C tests would then test nothing; a handler (not SIG_IGN) is reset to default in children
    signal.signal(signal.SIGINT, signal.default_int_handler)
if "GLMPERF_CACHE" not in os.environ:
    # the session's own cache (calibrated peaks, probes), shared by the runs and commands it starts, so a
    # test never reads what an earlier session or the user's own commands measured
    os.environ["GLMPERF_CACHE"] = tempfile.mkdtemp(prefix="glmperf-test-cache-")
    atexit.register(shutil.rmtree, os.environ["GLMPERF_CACHE"], ignore_errors=True)  # left behind, it piles up
TINY = ["data.corpus=synthetic", "data.seq_len=32", "train.batch_size=4", "profile.trace_window=[1, 1, 2]",
        "profile.sample_hz=20", "profile.flush_interval_s=0.2", "profile.warmup_steps=1"]
"""Overrides that make a `tiny` run take a second or two and flush often."""


def tiny_run(runs_dir: Path, *overrides: str, nproc: int = 1, hooks: tuple[TrainerHook, ...] = ()) -> Path:
    cfg = load_config(preset="tiny", overrides=[*TINY, *overrides], nproc=nproc)
    return profile_run(cfg, runs_dir=runs_dir, nproc=nproc, progress=False, hooks=hooks)


def cli(*args: str, runs_dir: Path, **kwargs) -> subprocess.Popen:
    """profile-run on the tiny preset in a subprocess (stdout and stderr captured)."""
    return subprocess.Popen([sys.executable, "-m", "profiler.cli", "--preset", "tiny", "--no-progress",
                             "--runs-dir", str(runs_dir), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def glmperf(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """The `glmperf` command in a subprocess."""
    return subprocess.run([sys.executable, "-c", "import sys; from profiler.cli import main; sys.exit(main())",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=240, **kwargs)


def wait_for_steps(runs_dir: Path, n: int, timeout: float = 120) -> Path:
    """The run under `runs_dir` once it has flushed `n` step rows."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for run_dir in runs_dir.glob("*"):
            steps = store.read_table(run_dir, "steps") if (run_dir / "parts").exists() else pd.DataFrame()
            if len(steps) >= n:
                return run_dir
        time.sleep(0.2)
    raise AssertionError(f"no run reached {n} flushed steps in {timeout}s")


def linear_steps(run: api.Run, model: torch.nn.Module, steps: int, *, batch: int = 32) -> None:
    """A user's own loop inside `run`: `steps` steps of a Linear `model` (forward, backward, SGD)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        with run.step(tokens=batch) as step:
            with run.phase("forward"):
                loss = model(torch.randn(batch, model.in_features)).pow(2).mean()
            with run.phase("backward"):
                loss.backward()
            with run.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            step.loss = loss.detach()


def copy_run(run_dir: Path, dest: Path) -> Path:
    """A copy of a run directory that a test may change."""
    return Path(shutil.copytree(run_dir, dest / run_dir.name))


class RaiseAt(TrainerHook):
    """Raises `exc` after step `step` ended (the instruments have recorded it)."""

    def __init__(self, step: int, exc: BaseException) -> None:
        self.step, self.exc = step, exc

    def on_step_end(self, record: StepRecord) -> None:
        if record.step == self.step:
            raise self.exc


class SnapshotAt(TrainerHook):
    """Copies the (only) run under `runs_dir` to `dest` after step `step`, once its rows are flushed."""

    def __init__(self, runs_dir: Path, dest: Path, step: int) -> None:
        self.runs_dir, self.dest, self.step = runs_dir, dest, step

    def on_step_end(self, record: StepRecord) -> None:
        if record.step == self.step:
            (run_dir,) = self.runs_dir.iterdir()
            deadline = time.time() + 10
            while len(store.read_table(run_dir, "steps")) < self.step + 1 and time.time() < deadline:
                time.sleep(0.05)
            shutil.copytree(run_dir, self.dest / run_dir.name, ignore=shutil.ignore_patterns("*.tmp"))


@pytest.fixture(scope="session")
def completed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run with a bottleneck on any machine: input bound by a slow reader (20 ms a batch).

    Whether a compute bottleneck shows on a tiny run depends on the CPU (its bf16 support, its
    speed); a data wait does not, so the diagnosis, its recommendation and what shows them are
    the same everywhere."""
    return tiny_run(tmp_path_factory.mktemp("completed"), "train.steps=8", "data.io_delay_ms=20", "name=completed")


@pytest.fixture(scope="session")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # brackets as a rank's error can hold them: printed verbatim, never read as markup
    crash = RaiseAt(5, RuntimeError("induced failure at step 5 [/bold] [process RSS (CPU)]"))
    return tiny_run(tmp_path_factory.mktemp("failed"), "train.steps=50", "profile.trace=false", "name=failed",
                    hooks=(crash,))


@pytest.fixture(scope="session")
def interrupted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("interrupted"), "train.steps=50", "profile.trace=false",
                    "name=interrupted", hooks=(RaiseAt(4, KeyboardInterrupt("induced Ctrl-C")),))


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("two_ranks"), "train.steps=6", "profile.trace=false", "name=two-ranks",
                    nproc=2)


@pytest.fixture(scope="session")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of a running run's directory after its step 5 was flushed (status `running`: its
    process, this one, is alive)."""
    runs, dest = tmp_path_factory.mktemp("live_runs"), tmp_path_factory.mktemp("live")
    tiny_run(runs, "train.steps=8", "profile.trace=false", "name=live", hooks=(SnapshotAt(runs, dest, 5),))
    (run_dir,) = dest.iterdir()
    return run_dir


@pytest.fixture(scope="session")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose process was killed with SIGKILL after 4 flushed steps (status `incomplete`)."""
    runs = tmp_path_factory.mktemp("killed")
    proc = cli("--steps", "100000", *[f"--set={o}" for o in TINY], "--no-trace", "--name", "killed", runs_dir=runs)
    run_dir = wait_for_steps(runs, 4)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    return run_dir
