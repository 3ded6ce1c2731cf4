"""The statistics of a comparison: is the candidate's figure worse than the baseline's, beyond a
threshold, with confidence? Pure functions over numbers; `profiler.compare.runs` feeds them runs.

The model (docs/ci.md, "How compare decides"):

- A run's figure is a statistic of its steady steps (the median, or the metric's percentile); a
  side's figure is the median of its runs' figures; the change is the ratio of the two.
- Its uncertainty, in log space, has two parts. Within runs: the variance of a seeded bootstrap of
  the ratio that resamples each run's steps. Between runs: steps of one run are not independent
  samples of the code's speed (identical runs differ by more than their steps suggest), so with at
  least `min_runs` runs a side the runs are the unit and their measured spread counts (Student's t
  for its few degrees of freedom); with fewer, a run-to-run noise floor does, raised on a busy
  machine in proportion to how much the steps themselves scatter, and for a speed to at least how
  far a run's speed shifted between its two halves (the machine's speed moved while it ran).
- The verdict reads the interval against the threshold, asv's rule: `regressed` when the change is
  beyond the threshold and the interval excludes no change, `improved` likewise the other way,
  `unchanged` when the whole interval lies within the threshold both ways, otherwise `inconclusive`
  with the reason and about how many runs a side would decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

VERDICTS = ("regressed", "improved", "unchanged", "inconclusive")
DEFAULT_RUN_NOISE: Mapping[str, float] = {"default": 0.10, "peak_memory": 0.02}
"""Relative standard deviation of a run's figure between identical runs, per metric (`default` for
the others). Identical `tiny` runs on a quiet 2-core machine had step-time medians with a cv of
9.7%, on a shared one 14% a run (benchmarks/results/compare_false_alarms.md: the busy-machine and
half-shift terms of `_between` cover the excess); memory high-water marks agree to about 1%.
Measure your runner's with benchmarks/compare_false_alarms.py."""
MAX_REPEATS = 100
"""Above this many runs a side, "how many would decide" is reported as "more than"."""
UNSTABLE_CV, OUTLIER = 0.10, 0.5
"""pyperf's stability rules: a run is unstable when its steps' std is 10% of their mean or more, or a
step lies 50% or more from the mean."""
FAST_END = 0.1
"""The share of a run's steps at its fast end that stands for its undisturbed speed (see `_disturbed`)."""


@dataclass(frozen=True)
class Options:
    """How sure the comparison must be, and what it assumes about noise it cannot see."""

    confidence: float = 0.99
    """Of the interval (asv uses 99% intervals and p < 0.002)."""
    run_noise: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RUN_NOISE))
    """The run-to-run noise floor per metric (see DEFAULT_RUN_NOISE), used with fewer than
    `min_runs` runs a side."""
    noise_per_spread: float = 0.5
    """On a busy machine runs differ more: the floor is at least this times the median robust
    spread (1.4826 MAD / median) of a compared run's steps."""
    min_steps: int = 10
    """Fewer steady steps in any run: inconclusive."""
    min_runs: int = 3
    """Runs a side from which the runs, not the steps, are the unit."""
    max_contention: float = 0.25
    """Share of the machine's CPU that other processes may take, beyond the cores a run leaves
    free, during its steady steps before it counts as busy (see `discount_contention`)."""
    bootstrap: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if "default" not in self.run_noise or any(v < 0 for v in self.run_noise.values()):
            raise ValueError("run_noise needs a `default` and values >= 0")
        if self.min_steps < 2 or self.min_runs < 2 or self.bootstrap < 100:
            raise ValueError("min_steps and min_runs must be >= 2, bootstrap >= 100")

    def noise_floor(self, metric: str) -> float:
        return float(self.run_noise.get(metric, self.run_noise["default"]))


def confidence_text(confidence: float) -> str:
    """A confidence as a percentage with the digits it has: 99%, 99.8%, 99.67% (never rounded up to 100%)."""
    return f"{100 * confidence:.4g}%"


@dataclass(frozen=True)
class Estimate:
    """One metric, baseline vs candidate: figures, change, interval, test and verdict."""

    verdict: str
    reason: str
    base: float
    cand: float
    change: float
    """cand / base - 1 (NaN when undefined)."""
    ci: tuple[float, float]
    """Interval of `change` at the options' confidence."""
    p_value: float
    """Mann-Whitney U, two-sided, over the units."""
    unit: str
    """"runs" or "steps": what the test and the between-run spread are over."""
    runs: tuple[int, int]
    steps: tuple[int, int]
    run_noise: float
    """Relative between-run standard deviation used."""
    run_noise_source: str
    repeats_needed: int | None = None
    """Runs a side that would likely decide an inconclusive result (None: not a matter of runs)."""
    stability: tuple[str, ...] = ()
    """pyperf-style warnings about the compared runs' steps."""


Values = Sequence[float] | np.ndarray
"""One run's per-step values of a metric."""


def _clean(x: Values) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    return a[np.isfinite(a)]


def robust_spread(x: np.ndarray) -> float:
    """1.4826 MAD / median: the step scatter that a few outliers (a GC, a page fault) do not inflate."""
    med = float(np.median(x))
    return 1.4826 * float(np.median(np.abs(x - med))) / abs(med) if med else 0.0


def _dispersion(x: np.ndarray) -> tuple[float, float]:
    """A run's steps' std over their mean, and how far (relative to the mean) its farthest step lies."""
    mean = float(np.mean(x)) if len(x) else 0.0
    if mean <= 0:
        return 0.0, 0.0
    return float(np.std(x)) / mean, max(float(np.max(x)) / mean - 1, 1 - float(np.min(x)) / mean)


def unstable(x: np.ndarray) -> bool:
    """pyperf's rules flag the run's steps: its figure may be as much the machine's as the code's."""
    cv, far = _dispersion(x)
    return cv >= UNSTABLE_CV or far >= OUTLIER


def _disturbed(verdict: str, b_runs: list[np.ndarray], c_runs: list[np.ndarray], names: tuple[Sequence[str],
               Sequence[str]], *, better: str, bar: float, half: float) -> str | None:
    """Why a speed verdict may be a disturbance of the machine, or None when it stands.

    A disturbance (another process, a page-cache flush) only ever slows a step down, and an unstable
    run is one it touched: its figure can move by as much as the disturbed share of its steps. So a
    regression with an unstable candidate run (an improvement with an unstable baseline run) stands
    only when the runs' fastest steps (FAST_END of each run, the least disturbed) show it too, by the
    same rule (beyond the threshold, the interval's half-width `half` excluding no change). An induced
    slowdown slows every step and stands; a run slowed in bursts does not."""
    side, runs, label = (1, c_runs, "candidate") if verdict == "regressed" else (0, b_runs, "baseline")
    shaky = [n for x, n in zip(runs, names[side], strict=True) if unstable(x)]
    if not shaky:
        return None
    q = FAST_END if better == "lower" else 1 - FAST_END
    fast_b, fast_c = (float(np.median([np.quantile(x, q) for x in rs])) for rs in (b_runs, c_runs))
    if fast_b <= 0 or fast_c <= 0:
        return None
    sign = 1.0 if better == "lower" else -1.0
    bad = sign * math.log(fast_c / fast_b)
    if (bad > bar and bad - half > 0) if verdict == "regressed" else (bad < -bar and bad + half < 0):
        return None
    return (f"the {label} run {', '.join(shaky)} is unstable (pyperf's rules, see the stability lines) and its "
            f"fastest steps do not show the change beyond the noise ({math.expm1(sign * bad):+.1%} at the fast "
            f"{FAST_END:.0%}): "
            "a disturbance of the machine, which only slows steps, could explain it; rerun on a quiet machine")


def stability_warnings(x: np.ndarray, *, name: str, unit: str) -> list[str]:
    """pyperf's stability rules (std >= 10% of the mean, min or max >= 50% from the mean, values
    under 1 ms), said of one run in one line, or nothing when it is stable."""
    mean = float(np.mean(x)) if len(x) else 0.0
    if mean <= 0:
        return []
    found = []
    cv, far = _dispersion(x)
    if cv >= UNSTABLE_CV:
        found.append(f"steps vary by {cv:.0%} of the mean (unstable from {UNSTABLE_CV:.0%})")
    if far >= OUTLIER:
        found.append(f"a step is {far:.0%} away from the mean (an outlier from {OUTLIER:.0%})")
    if unit == "ms" and float(np.min(x)) < 1.0:
        found.append("a step under 1 ms (timer and loop overheads dominate)")
    return [f"{name}: {', '.join(found)}"] if found else []


def half_shift(x: np.ndarray) -> float:
    """|log| of the ratio of the medians of a run's two halves: how far its speed moved while it ran."""
    half = len(x) // 2
    a, b = float(np.median(x[:half])), float(np.median(x[half:]))
    return abs(math.log(b / a)) if a > 0 and b > 0 else 0.0


def _mann_whitney(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(np.concatenate([a, b])) == 0:
        return 1.0
    from scipy import stats  # on first use: every glmperf command imports this module for its help

    return float(stats.mannwhitneyu(b, a, alternative="two-sided").pvalue)


def _bootstrap_variance(base: list[np.ndarray], cand: list[np.ndarray], q: float, opts: Options) -> float:
    """Variance of log(cand figure / base figure) when each run's steps are resampled."""
    rng = np.random.default_rng(opts.seed)

    def side(runs: list[np.ndarray]) -> np.ndarray:
        figures = [np.quantile(x[rng.integers(0, len(x), size=(opts.bootstrap, len(x)))], q, axis=1)
                   for x in runs]
        return np.median(np.vstack(figures), axis=0)

    with np.errstate(divide="ignore", invalid="ignore"):
        reps = np.log(side(cand)) - np.log(side(base))
    reps = reps[np.isfinite(reps)]
    return float(np.var(reps)) if len(reps) > 1 else math.inf


def _between(fb: np.ndarray, fc: np.ndarray, spread: float, shift: float, floor: float, opts: Options
             ) -> tuple[float, str, int | None]:
    """The between-run standard deviation (log), where it comes from, and its degrees of freedom
    (None: a floor, read with the normal distribution)."""
    logs = [np.log(f) for f in (fb, fc) if len(f) >= 2]
    df = sum(len(x) - 1 for x in logs)
    measured = math.sqrt(sum(float(np.sum((x - x.mean()) ** 2)) for x in logs) / df) if df else None
    if min(len(fb), len(fc)) >= opts.min_runs and measured is not None:
        return measured, f"measured over {len(fb)}+{len(fc)} runs", df
    busy = opts.noise_per_spread * spread
    candidates = [(floor, "noise floor"), (busy, f"busy machine: {opts.noise_per_spread:g} x step spread "
                                                  f"{spread:.0%}"),
                  (shift, f"a run's speed shifted by {math.expm1(shift):.0%} between its halves")]
    if measured is not None:
        candidates.append((measured, f"measured over {len(fb)}+{len(fc)} runs"))
    sigma, source = max(candidates)
    return sigma, source, None


def _repeats(gap: float, var_within: float, sigma: float, runs: tuple[int, int], crit: float) -> int | None:
    """Runs a side for which the interval's half-width falls under `gap`, the per-run variances held."""
    if gap <= 1e-9:
        return None
    per_pair = var_within / (1 / runs[0] + 1 / runs[1]) + sigma**2
    k = math.ceil(2 * crit**2 * per_pair / gap**2)
    return max(k, max(runs) + 1)


def compare_series(base: Sequence[Values], cand: Sequence[Values], *, better: str, limit: float,
                   quantile: float = 0.5, floor: float, options: Options | None = None, unit: str = "",
                   speed: bool = True, names: tuple[Sequence[str], Sequence[str]] | None = None) -> Estimate:
    """Baseline runs vs candidate runs of one metric (one series of per-step values per run).

    `limit`: the threshold, a relative change in the bad direction (0.05 for +5% step time or -5%
    tokens/s); `better`: "lower" or "higher"; `quantile`: the run figure's statistic of its steps;
    `floor`: the metric's run-to-run noise floor; `speed`: the metric moves with the machine's speed
    (a run's shift between its halves counts as run-to-run noise; not so for memory, whose growth
    would). `names` label the runs in warnings.
    """
    from scipy import stats

    options = options or Options()
    if better not in ("lower", "higher") or not 0 <= limit < (1 if better == "higher" else math.inf):
        raise ValueError(f"bad direction {better!r} or threshold {limit!r}")
    b_runs, c_runs = [_clean(x) for x in base], [_clean(x) for x in cand]
    if not b_runs or not c_runs:
        raise ValueError("each side needs at least one run")
    names = names or ([f"baseline run {i + 1}" for i in range(len(b_runs))],
                      [f"candidate run {i + 1}" for i in range(len(c_runs))])
    runs = (len(b_runs), len(c_runs))
    steps = (sum(map(len, b_runs)), sum(map(len, c_runs)))
    fb = np.array([np.quantile(x, quantile) if len(x) else math.nan for x in b_runs])
    fc = np.array([np.quantile(x, quantile) if len(x) else math.nan for x in c_runs])
    b_fig, c_fig = float(np.median(fb)), float(np.median(fc))
    warnings = tuple(w for x, n in zip(b_runs + c_runs, [*names[0], *names[1]], strict=True)
                     for w in stability_warnings(x, name=n, unit=unit))

    def result(verdict: str, reason: str, **kw: object) -> Estimate:
        fields: dict = {"change": c_fig / b_fig - 1 if b_fig else math.nan, "ci": (math.nan, math.nan),
                        "p_value": math.nan, "unit": "steps", "run_noise": math.nan, "run_noise_source": ""}
        fields.update(kw)
        return Estimate(verdict=verdict, reason=reason, base=b_fig, cand=c_fig, runs=runs, steps=steps,
                        stability=warnings, **fields)

    fewest = min(len(x) for x in b_runs + c_runs)
    if fewest < options.min_steps:
        return result("inconclusive", f"too few steps: a run has {fewest} steady step(s), "
                                      f"{options.min_steps} needed")
    if not (np.all(fb > 0) and np.all(fc > 0)):
        if np.all(fb == 0) and np.all(fc == 0):
            return result("unchanged", "zero on both sides", change=0.0, ci=(0.0, 0.0))
        return result("inconclusive", "zero in a run: a relative change is undefined")

    sign = 1.0 if better == "lower" else -1.0
    d = math.log(c_fig / b_fig)
    var_within = _bootstrap_variance(b_runs, c_runs, quantile, options)
    # typical, not worst: one disturbed run must not widen every comparison (its own stability
    # warnings name it)
    spread = float(np.median([robust_spread(x) for x in b_runs + c_runs]))
    shift = float(np.median([half_shift(x) for x in b_runs + c_runs])) if speed else 0.0
    sigma, source, df = _between(fb, fc, spread, shift, floor, options)
    var_between = sigma**2 * (1 / runs[0] + 1 / runs[1])
    level = (1 + options.confidence) / 2
    if df is None:
        unit_kind, crit, var = "steps", float(stats.norm.ppf(level)), var_within + var_between
        units = (np.concatenate(b_runs), np.concatenate(c_runs))
    else:
        unit_kind, crit, var = "runs", float(stats.t.ppf(level, df)), max(var_within, var_between)
        units = (fb, fc)
    half = crit * math.sqrt(var)
    ci = (math.exp(d - half) - 1, math.exp(d + half) - 1)
    bad, bad_lo, bad_hi = sign * d, sign * d - half, sign * d + half
    bar = sign * math.log(1 + sign * limit)
    common = {"ci": ci, "p_value": _mann_whitney(*units), "unit": unit_kind, "run_noise": sigma,
              "run_noise_source": source}
    pct = f"{100 * limit:g}%"
    for verdict, beyond, reason in (("regressed", bad > bar and bad_lo > 0, f"beyond the {pct} threshold"),
                                    ("improved", bad < -bar and bad_hi < 0, f"better by more than {pct}")):
        if beyond:
            shaky = _disturbed(verdict, b_runs, c_runs, names, better=better, bar=bar, half=half) if speed else None
            if shaky:
                return result("inconclusive", f"looks {verdict} ({math.expm1(d):+.1%}), but {shaky}", **common)
            return result(verdict, f"{reason} with {confidence_text(options.confidence)} confidence", **common)
    if bad_hi <= bar and bad_lo >= -bar:
        return result("unchanged", f"within {pct} either way with {confidence_text(options.confidence)} confidence",
                      **common)
    gap = abs(bad) if abs(bad) > bar else bar - abs(bad)
    repeats = _repeats(gap, var_within, sigma, runs, float(stats.norm.ppf(level)))
    decide = ("the change sits on the threshold: no number of runs would decide it" if repeats is None else
              f"more than {MAX_REPEATS} runs a side would be needed: the threshold is below this noise"
              if repeats > MAX_REPEATS else f"about {repeats} runs a side would decide")
    reason = (f"too noisy: the {confidence_text(options.confidence)} interval [{ci[0]:+.1%}, {ci[1]:+.1%}] spans both "
              f"no change and the {pct} threshold (between-run noise {sigma:.1%}, {source}); {decide}")
    return result("inconclusive", reason, repeats_needed=repeats, **common)


def discount_contention(e: Estimate, *, base: float | None, cand: float | None, limit: float) -> Estimate:
    """A speed verdict that other processes on the machine could explain is inconclusive.

    `base`, `cand`: the largest CPU contention over each side's runs (the share of the machine other
    processes took beyond the cores the run left free; None where not measured, e.g. on a GPU).
    Contention can only slow a run down: a regression measured on a contended candidate, or an
    improvement over a contended baseline, may be the other processes'. A regression over a
    contended baseline stands (the contention worked against it)."""
    busy = {"regressed": ("candidate", cand), "improved": ("baseline", base)}.get(e.verdict)
    if busy is None or busy[1] is None or busy[1] <= limit:
        return e
    return replace(e, verdict="inconclusive", reason=f"the machine was busy: other processes took {busy[1]:.0%} of "
                   f"its CPU beyond the cores a {busy[0]} run left free (more than {limit:.0%}), which alone could "
                   f"make it look {e.verdict} (measured {e.change:+.1%}); rerun on a quiet machine")


@dataclass(frozen=True)
class Parity:
    """Loss at equal steps: same seed and data should give the same curve."""

    verdict: str
    """"match", "drift" (a numerics change, not a speed change) or "not comparable"."""
    reason: str
    tolerance: float
    max_rel_diff: float = math.nan
    at_step: int | None = None
    steps_compared: int = 0


def loss_parity(base: pd.Series, cand: pd.Series, *, tolerance: float) -> Parity:
    """Largest relative loss difference over the steps both curves have (series indexed by step)."""
    both = pd.concat([base.rename("b"), cand.rename("c")], axis=1, join="inner").dropna()
    if both.empty:
        return Parity("not comparable", "no step has a loss on both sides", tolerance)
    rel = (both["c"] - both["b"]).abs() / both["b"].abs().clip(lower=1e-12)
    step = int(rel.idxmax())
    worst = float(rel.max())
    where = f"{worst:.3%} at step {step} over {len(both)} steps (tolerance {tolerance:.3%})"
    if worst > tolerance:
        return Parity("drift", f"the loss curves part: {where}", tolerance, worst, step, len(both))
    return Parity("match", f"the loss curves agree: largest difference {where}", tolerance, worst, step, len(both))
