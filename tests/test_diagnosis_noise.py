"""The diagnosis does not read noise as a finding: a loss that only fluctuates is not `unstable`, and a
run made while other processes kept the CPU busy is said to be not representative instead of
`compute_bound`.

The real runs are `tiny` runs with one torch thread (`profile-run` subprocesses, as the scenarios',
or in this process for the busy one, whose hook starts busy loops once training has started), so
a neighbour on the machine that keeps one core busy takes nothing from them.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from benchmarks.diagnosis_scenarios import Scenario, run
from profiler import store
from profiler.advice import diagnose as d
from profiler.analysis import analyze, load_run, stability
from profiler.capture.run import profile_run
from profiler.config import load_config
from reference_model.hooks import StepRecord, TrainerHook
from tests.test_diagnose_rules import figures

EPS = 1e-6
FLAT = ("data.corpus=synthetic", "train.lr=1e-9")
"""Random tokens and a learning rate that leaves the model as it was: the loss is the batches' noise."""


def _profile(tmp_path: Path, *overrides: str, steps: int) -> tuple[dict, Path]:
    record = run(Scenario("noise", "", "tiny", overrides), tmp_path, steps=steps, threads=1)
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "run.json").exists()]
    return record, run_dir


def _unstable(record: dict) -> list[dict]:
    return [b for b in record["diagnosis"]["bottlenecks"] if b["kind"] == "unstable"]


# -- a rising loss, against the run's own noise -----------------------------------------------------


@pytest.mark.slow
def test_a_flat_loss_that_ends_higher_is_noise_not_unstable(tmp_path: Path) -> None:
    """25 counted steps of random tokens: the last loss is above the first (the old rule's rising loss,
    severity 0.5), the rise between the thirds is inside its 99% bound."""
    record, run_dir = _profile(tmp_path, *FLAT, steps=30)
    f = analyze(load_run(run_dir))
    assert f["loss_change"].value > 0  # what the old rule called a rising loss
    assert _unstable(record) == [], _unstable(record)
    assert f["loss_steps"].value >= stability.MIN_STEPS
    assert f["loss_rise"].value < f["loss_rise_bound"].value


@pytest.mark.slow
def test_a_rise_over_too_few_steps_is_not_judged_and_says_so(tmp_path: Path) -> None:
    """4 steps of random tokens whose last loss is above the first: too few to tell a rise from noise."""
    record, run_dir = _profile(tmp_path, *FLAT, "train.seed=1", steps=4)
    f = analyze(load_run(run_dir))
    assert f["loss_change"].value > 0
    assert _unstable(record) == [], _unstable(record)
    assert math.isnan(f["loss_rise"].value) and f["loss_steps"].value < stability.MIN_STEPS
    (skip,) = [s for s in record["diagnosis"]["skipped"] if s["rule"] == "unstable"]
    assert skip["reason"].startswith(f"loss rise not judged: {f['loss_steps'].value:.0f} counted step(s), "
                                     f"fewer than {stability.MIN_STEPS}")


def _noisy(n: int, seed: int = 0) -> pd.Series:
    return pd.Series(4.0 + 0.05 * np.random.default_rng(seed).standard_normal(n))


def test_the_rise_is_judged_from_min_steps_on() -> None:
    short = stability.loss_rise(_noisy(stability.MIN_STEPS - 1))
    enough = stability.loss_rise(_noisy(stability.MIN_STEPS))
    assert short["loss_steps"].value == stability.MIN_STEPS - 1
    assert all(math.isnan(short[n].value) for n in ("loss_rise", "loss_rise_bound", "risen_steps"))
    assert all(not math.isnan(enough[n].value) for n in ("loss_rise", "loss_rise_bound", "risen_steps"))
    with_nan = pd.concat([_noisy(stability.MIN_STEPS - 1), pd.Series([math.nan, math.inf])])
    assert math.isnan(stability.loss_rise(with_nan)["loss_rise"].value)  # only finite losses count


def test_the_bound_is_the_step_to_step_noise_and_a_trend_does_not_widen_it() -> None:
    flat = _noisy(30)
    ramp = flat + np.linspace(0.0, 0.3, 30)  # +7.5%: far past the noise of one step (1.25%)
    a, b = stability.loss_rise(flat), stability.loss_rise(ramp)
    assert a["loss_rise"].value < a["loss_rise_bound"].value
    assert b["loss_rise"].value > b["loss_rise_bound"].value and b["risen_steps"].value > 0
    # the bound: 2.33 x the noise (differences' spread / sqrt 2) x sqrt(2 / third), in % of the first third
    noise = float(np.diff(flat.to_numpy()).std(ddof=1)) / math.sqrt(2)
    expected = 100 * stability.RISE_Z * noise * math.sqrt(2 / 10) / float(flat[:10].mean())
    assert a["loss_rise_bound"].value == pytest.approx(expected)
    assert b["loss_rise_bound"].value == pytest.approx(expected * float(flat[:10].mean()) / float(ramp[:10].mean()))


def test_a_rise_fires_only_past_its_bound_with_the_steps_it_affected_as_severity() -> None:
    judged = {"loss_steps": 20.0, "loss_rise_bound": 1.0, "risen_steps": 5.0}
    assert "unstable" not in [b["kind"] for b in d.diagnose(figures(**judged, loss_rise=1.0))["bottlenecks"]]
    (finding,) = d.diagnose(figures(**judged, loss_rise=1.0 + EPS))["bottlenecks"]
    assert finding["kind"] == "unstable" and finding["severity"] == pytest.approx(5.0 / 20.0)  # of steps_counted
    assert "of 20 counted steps, beyond its noise (bound 1.00%" in finding["message"]
    assert {"loss_rise", "loss_rise_bound", "risen_steps", "loss_steps"} <= set(finding["evidence"])


def test_the_reported_six_step_run_is_not_unstable() -> None:
    """A 6-step run whose loss changed +0.1%, with no non-finite value and no spike: the old rule said
    unstable, explaining 50%."""
    result = d.diagnose(figures(loss_change=0.1, loss_steps=6.0, steps_counted=6.0))
    assert result["bottlenecks"] == []
    assert {"rule": "unstable", "reason": "loss rise not judged: 6 counted step(s), fewer than 12 (non-finite "
            "values, skipped steps, spikes and grad-norm outliers were checked)"} in result["skipped"]


# -- a run on a busy machine -------------------------------------------------------------------------


class BusyLoops(TrainerHook):
    """`n` busy loops beside the training, from the end of its first step to the end of its last: the
    steps are measured on a busy machine, the start and the end of the run (imports, peaks) are not.

    Each loop is left by the shell that started it (its parent is then init, not this process): the
    sampler counts this process's children as the run's own loader workers."""

    def __init__(self, n: int, last_step: int) -> None:
        self.n, self.last_step, self.pids = n, last_step, list[int]()

    def on_step_end(self, record: StepRecord) -> None:
        if record.step == 0:
            loop = f"{shlex.quote(sys.executable)} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
            self.pids = [int(subprocess.run(["sh", "-c", loop], capture_output=True, text=True, check=True).stdout)
                         for _ in range(self.n)]
        if record.step == self.last_step:
            self.stop()

    def stop(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.pids = []


def _one_thread_run(tmp_path: Path, *hooks: TrainerHook) -> Path:
    """`tiny` as shipped on random tokens, 60 steps, in this process with one torch thread, the CPU
    sampled at 20 Hz. Quiet, its MFU is near 30%; beside busy loops the old diagnosis read it as
    compute_bound."""
    cfg = load_config(preset="tiny", overrides=["data.corpus=synthetic", "train.steps=60", "profile.trace=false",
                                                "profile.sample_hz=20"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return profile_run(cfg, runs_dir=tmp_path, nproc=1, progress=False, hooks=hooks)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_a_run_beside_busy_loops_is_not_representative_nor_compute_bound(tmp_path: Path) -> None:
    """Three busy loops per core: the run's one thread shares a core with three of them: about a quarter of it."""
    cores = len(os.sched_getaffinity(0))
    loops = BusyLoops(3 * cores, last_step=59)
    try:
        run_dir = _one_thread_run(tmp_path, loops)
    finally:
        loops.stop()
    diagnosis, f = store.read_run(run_dir)["diagnosis"], analyze(load_run(run_dir))
    assert "compute_bound" not in [b["kind"] for b in diagnosis["bottlenecks"]], diagnosis["verdict"]
    assert diagnosis["representative"] is False, f["cpu_contention"]
    assert f["cpu_contention"].value >= d.BUSY_MACHINE and f["other_cpu_busy"].value > cores / 2
    assert diagnosis["not_representative"].startswith(f"other processes kept {f['other_cpu_busy'].value:.1f} of "
                                                      f"{cores} cores busy during the run")
    assert diagnosis["verdict"].startswith(f"not representative: {diagnosis['not_representative']}. ")
    assert any(s["rule"] == "compute_bound" and "not representative" in s["reason"] for s in diagnosis["skipped"])


@pytest.mark.slow
def test_a_run_on_a_quiet_machine_is_representative(tmp_path: Path) -> None:
    """The same run without the loops (a neighbour keeping one core busy takes the core it left free)."""
    run_dir = _one_thread_run(tmp_path)
    diagnosis, f = store.read_run(run_dir)["diagnosis"], analyze(load_run(run_dir))
    assert diagnosis["representative"] is True, f["cpu_contention"]
    assert "not_representative" not in diagnosis
    assert f["cpu_contention"].value < d.BUSY_MACHINE
    assert not diagnosis["verdict"].startswith("not representative")


def test_busy_from_the_threshold_on_and_compute_bound_only_when_representative() -> None:
    busy = {"cpu_contention": d.BUSY_MACHINE, "other_cpu_busy": 1.6, "cores": 2.0, "thread_demand": 1.0,
            "step_spread": 2.4, "mfu": 4.5}
    quiet = d.diagnose(figures(**{**busy, "cpu_contention": d.BUSY_MACHINE - EPS}))
    assert quiet["representative"] is True and "not_representative" not in quiet
    assert [b["kind"] for b in quiet["bottlenecks"]] == ["compute_bound"]
    result = d.diagnose(figures(**busy))
    line = ("other processes kept 1.6 of 2 cores busy during the run, 50% of the CPU its threads wanted; "
            "step p90 is 2.4x p50: rerun on a quiet machine")
    assert result["representative"] is False and result["not_representative"] == line
    assert result["bottlenecks"] == []
    assert result["verdict"] == (f"not representative: {line}. no bottleneck found: the biggest phase is backward "
                                 "(60% of the step)")
    # a finding of its own still shows, after the warning
    assert d.diagnose(figures(**busy, data_wait=50.0))["verdict"].startswith(f"not representative: {line}. "
                                                                             "input_bound: ")


def test_a_run_without_cpu_samples_is_representative() -> None:
    result = d.diagnose(figures(mfu=4.5, other_cpu_busy=math.nan))
    assert result["representative"] is True and [b["kind"] for b in result["bottlenecks"]] == ["compute_bound"]
