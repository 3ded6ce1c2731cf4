"""The comparison statistics on synthetic step series, and the gate's thresholds and options."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from profiler.compare.gate import LOSS_PARITY, GateError, Threshold, make_gate, parse_threshold
from profiler.compare.runs import Comparison, MetricComparison
from profiler.compare.stats import Options, compare_series, discount_contention, loss_parity, stability_warnings

QUIET = Options(run_noise={"default": 0.01})
"""A quiet, pinned machine whose identical runs agree to 1%."""


def series(mean: float, noise: float, n: int, seed: int) -> np.ndarray:
    return mean * (1 + noise * np.random.default_rng(seed).standard_normal(n))


def runs(mean: float, noise: float, n: int, k: int, seed: int, run_noise: float = 0.01) -> list[np.ndarray]:
    """k runs of n steps, each run's level off by its own run-to-run factor."""
    rng = np.random.default_rng(seed)
    return [series(mean * (1 + run_noise * rng.standard_normal()), noise, n, seed * 100 + i) for i in range(k)]


def step_time(base, cand, options: Options = QUIET, limit: float = 0.05):
    base = base if isinstance(base, list) else [base]
    cand = cand if isinstance(cand, list) else [cand]
    return compare_series(base, cand, better="lower", limit=limit, floor=options.noise_floor("step_time_p50"),
                          options=options, unit="ms")


def test_a_10pct_slowdown_in_2pct_noise_over_30_steps_is_regressed() -> None:
    e = step_time(series(20, 0.02, 30, 1), series(22, 0.02, 30, 2))
    assert e.verdict == "regressed", e.reason
    assert 0.08 < e.change < 0.12 and 0 < e.ci[0] < e.change < e.ci[1]
    assert e.p_value < 1e-6 and e.unit == "steps"


def test_with_repeats_the_runs_are_the_unit_and_the_default_floor_steps_aside() -> None:
    e = step_time(runs(20, 0.02, 30, 5, 1), runs(22, 0.02, 30, 5, 2), Options())
    assert e.verdict == "regressed", e.reason
    assert e.unit == "runs" and e.runs == (5, 5) and "measured over 5+5 runs" in e.run_noise_source


def test_the_same_slowdown_in_30pct_noise_over_5_steps_is_inconclusive() -> None:
    e = step_time(series(20, 0.3, 5, 1), series(22, 0.3, 5, 2))
    assert e.verdict == "inconclusive" and "too few steps" in e.reason


def test_too_much_step_noise_is_inconclusive_and_says_what_would_decide() -> None:
    e = step_time(series(20, 0.3, 30, 1), series(22, 0.3, 30, 2))
    assert e.verdict == "inconclusive" and e.reason.startswith("too noisy")
    assert e.repeats_needed and e.repeats_needed > 1 and f"about {e.repeats_needed} runs a side" in e.reason
    assert any("steps vary by" in w for w in e.stability)


def test_one_run_a_side_cannot_claim_10pct_over_the_default_run_noise() -> None:
    e = step_time(series(20, 0.02, 30, 1), series(22, 0.02, 30, 2), Options())
    assert e.verdict == "inconclusive" and "noise floor" in e.reason and "runs a side would decide" in e.reason


def test_identical_distributions_are_unchanged() -> None:
    assert step_time(series(20, 0.02, 30, 1), series(20, 0.02, 30, 2)).verdict == "unchanged"
    e = step_time(runs(20, 0.02, 30, 5, 1), runs(20, 0.02, 30, 5, 2), Options())
    assert e.verdict == "unchanged", e.reason


def test_an_improvement_is_improved_in_either_direction_and_never_a_failure() -> None:
    faster = step_time(series(20, 0.02, 30, 1), series(17, 0.02, 30, 2))
    more = compare_series([series(1000, 0.02, 30, 1)], [series(1200, 0.02, 30, 2)], better="higher", limit=0.05,
                          floor=0.01, options=QUIET)
    assert faster.verdict == "improved" and more.verdict == "improved" and more.change > 0.15
    comparison = Comparison(base=("a",), cand=("b",), options=QUIET, parity=loss_parity(
        pd.Series([1.0]), pd.Series([1.0]), tolerance=0.01), parity_threshold=Threshold(LOSS_PARITY, 0.01, False),
        metrics=(MetricComparison("step_time_p50", "time/step p50", "ms", "lower", Threshold("step_time_p50", 0.05),
                                  faster),), phases=(), ops=(), ops_time="", differences=(), across_devices=None,
        contention=(None, None), notes=())
    assert comparison.failures == () and comparison.verdict == "improved"


def test_a_throughput_drop_is_a_regression() -> None:
    e = compare_series([series(1000, 0.02, 30, 1)], [series(850, 0.02, 30, 2)], better="higher", limit=0.05,
                       floor=0.01, options=QUIET)
    assert e.verdict == "regressed" and e.change < -0.1


def test_identical_runs_with_real_run_to_run_noise_do_not_cry_wolf() -> None:
    """Steps of one run are not samples of the code's speed: with 10% run-to-run noise a test that
    treats steps as samples flags most A/A pairs; compare flags (almost) none."""
    pairs = [(series(20 * (1 + 0.1 * np.random.default_rng(i).standard_normal()), 0.12, 30, 1000 + i),
              series(20 * (1 + 0.1 * np.random.default_rng(500 + i).standard_normal()), 0.12, 30, 2000 + i))
             for i in range(100)]
    verdicts = [step_time(a, b, Options()) for a, b in pairs]
    assert sum(v.verdict == "regressed" for v in verdicts) <= 2
    assert sum(v.p_value < 0.01 for v in verdicts) > 50  # what steps-as-samples would have called a change


def test_a_busy_machine_raises_the_floor() -> None:
    scattered = np.abs(np.tile(series(20, 0.6, 15, 1), 2))  # halves alike: scatter, no shift
    e = step_time(scattered, scattered[::-1].copy(), Options())
    assert "busy machine" in e.run_noise_source and e.run_noise > 0.1


def test_other_processes_can_only_slow_a_run_down() -> None:
    slower = step_time(series(20, 0.02, 30, 1), series(22, 0.02, 30, 2))
    busy_cand = discount_contention(slower, base=0.0, cand=0.6, limit=0.25)
    assert busy_cand.verdict == "inconclusive" and "other processes took 60% of its CPU" in busy_cand.reason
    assert discount_contention(slower, base=0.6, cand=0.0, limit=0.25) == slower  # it worked against the change
    assert discount_contention(slower, base=None, cand=None, limit=0.25) == slower
    assert discount_contention(slower, base=0.0, cand=0.2, limit=0.25) == slower
    faster = step_time(series(22, 0.02, 30, 1), series(20, 0.02, 30, 2))
    assert discount_contention(faster, base=0.6, cand=0.0, limit=0.25).verdict == "inconclusive"


def test_a_run_whose_speed_shifted_midway_counts_as_run_to_run_noise() -> None:
    """Seen on identical tiny runs: 21.5 ms a step for 17 steps, then 14 ms."""
    shifted = np.concatenate([series(21.5, 0.02, 17, 2), series(14, 0.02, 13, 3)])
    e = step_time(series(14, 0.02, 30, 1), shifted, Options())
    assert e.verdict == "inconclusive" and "shifted by" in e.run_noise_source
    memory = compare_series([np.linspace(1.0, 1.0, 30)], [np.linspace(1.0, 1.3, 30)], better="lower", limit=0.1,
                            quantile=1.0, floor=0.02, speed=False)
    assert memory.verdict == "regressed"  # a growing high-water mark is the finding, not noise


def test_the_interval_is_seeded_and_deterministic() -> None:
    a, b = series(20, 0.1, 30, 1), series(21, 0.1, 30, 2)
    assert step_time(a, b) == step_time(a.copy(), b.copy())
    assert step_time(a, b, Options(run_noise={"default": 0.01}, seed=1)).ci != step_time(a, b).ci


def test_zero_on_both_sides_is_unchanged_and_on_one_side_inconclusive() -> None:
    zeros = np.zeros(30)
    assert step_time(zeros, zeros).verdict == "unchanged"
    assert step_time(zeros, series(1, 0.1, 30, 1)).verdict == "inconclusive"


def test_stability_follows_pyperfs_rules() -> None:
    assert stability_warnings(np.full(30, 20.0), name="r", unit="ms") == []
    (line,) = stability_warnings(np.array([20.0] * 29 + [200.0]), name="r", unit="ms")
    assert line.startswith("r: ") and "steps vary by" in line and "away from the mean" in line
    assert "under 1 ms" in stability_warnings(np.full(30, 0.5), name="r", unit="ms")[0]


def test_loss_parity_matches_drifts_and_needs_common_steps() -> None:
    base = pd.Series([5.0, 4.0, 3.0], index=[0, 1, 2])
    assert loss_parity(base, base.copy(), tolerance=0.01).verdict == "match"
    drift = loss_parity(base, pd.Series([5.0, 4.0, 3.3], index=[0, 1, 2]), tolerance=0.01)
    assert drift.verdict == "drift" and drift.at_step == 2 and math.isclose(drift.max_rel_diff, 0.1)
    assert loss_parity(base, pd.Series([1.0], index=[7]), tolerance=0.01).verdict == "not comparable"


@pytest.mark.parametrize(("text", "limit"), [("step_time_p50:+5%", 0.05), ("step_time_p50:5%", 0.05),
                                             ("tokens_per_s:-5%", 0.05), ("peak_memory:+10%", 0.10),
                                             ("loss_parity:0.5%", 0.005)])
def test_thresholds_parse(text: str, limit: float) -> None:
    t = parse_threshold(text)
    assert math.isclose(t.limit, limit) and t.gated and t.text.lstrip("+-") == text.split(":")[1].lstrip("+-")


@pytest.mark.parametrize(("text", "message"), [
    ("step_tme_p50:+5%", "unknown metric 'step_tme_p50'; known: step_time_p50, step_time_p90"),
    ("tokens_per_s:+5%", "tokens_per_s is better higher"),
    ("step_time_p50:-5%", "step_time_p50 is better lower"),
    ("step_time_p50:5", "must be a percentage such as +5%"),
    ("step_time_p50", "NAME:THRESHOLD"),
    ("tokens_per_s:-100%", "a drop under 100%"),
])
def test_bad_thresholds_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(GateError, match=None) as info:
        parse_threshold(text)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_default_gate_and_a_gate_file_and_the_command_line_on_top() -> None:
    default = make_gate()
    assert [t.metric for t in default.gated] == ["step_time_p50", "tokens_per_s", "peak_memory"]
    assert default.threshold("loss_parity") is not None and not default.threshold("loss_parity").gated
    gate = make_gate({"metrics": {"step_time_p50": "+3%"}, "report": {"mfu": "-5%"}, "confidence": 0.95,
                      "run_noise": {"default": 0.05, "peak_memory": 0.01}},
                     metrics=["step_time_p50:+8%", "loss_parity:1%"], run_noise=0.07)
    assert {t.metric: t.limit for t in gate.gated} == {"step_time_p50": 0.08, "loss_parity": 0.01}
    assert [t.metric for t in gate.thresholds if not t.gated] == ["mfu"]
    assert gate.options.confidence == 0.95 and gate.options.noise_floor("step_time_p50") == 0.07
    assert gate.options.noise_floor("peak_memory") == 0.01


@pytest.mark.parametrize(("data", "message"), [
    (["step_time_p50"], "expected a mapping"),
    ({"metric": {}}, "unknown key(s) metric; known: metrics, report, confidence"),
    ({"metrics": ["step_time_p50"]}, "`metrics` must map metric names to thresholds"),
    ({"metrics": {"step_time_p50": 0.05}}, "must be a percentage"),
    ({"confidence": 2}, "confidence must be in [0.5, 1)"),
    ({"run_noise": {"bogus": 0.1}}, "unknown metric 'bogus'"),
    ({"run_noise": "high"}, "run_noise must be a number or a mapping"),
])
def test_a_malformed_gate_file_is_one_line(data: object, message: str) -> None:
    with pytest.raises(GateError) as info:
        make_gate(data, source="gate file g.yaml")
    assert message in str(info.value) and "\n" not in str(info.value)
