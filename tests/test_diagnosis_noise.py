"""The diagnosis does not read noise as a finding: a loss that only fluctuates is not `unstable`.

The real runs are `tiny` runs with one torch thread (`profile-run` subprocesses, as the scenarios').
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.diagnosis_scenarios import Scenario, run
from profiler.advice import diagnose as d
from profiler.analysis import analyze, load_run, stability
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
