"""Numerical health: non-finite values, skipped steps, loss spikes and plateaus, grad-norm outliers,
and torch.compile recompiling during the run (events.jsonl, steps.parquet).

Figures: `non_finite` (events), `skipped_steps`, `rollbacks` (events: returns to an earlier state,
each also a skipped step), `loss_spikes`, `loss_plateaus`, `grad_norm_outliers` (steps whose grad
norm is above 10x the median of the 20 steps before it: a spike, not the fast fall of early
training), `loss_change` (% from the first to the last step), `recompiles` (frames compiled after
the first step).

Whether the loss rose, beyond the run's own noise (`loss_rise`): over the counted steps' finite
losses, the mean of the last third against the mean of the first third. One step's noise is
estimated from step-to-step differences (their standard deviation over sqrt 2: a slow trend moves
their mean, not their spread), so the difference of the two means has a standard error of
noise x sqrt(2 / third). Figures: `loss_steps` (the counted steps with a finite loss),
`loss_rise` (% of the first third's mean), `loss_rise_bound` (%: RISE_Z standard errors, the
one-sided 99% bound of a flat loss) and `risen_steps` (the counted steps after the first third
whose loss is above the first third's mean plus that bound). With fewer than MIN_STEPS the rise is
not judged: those three are NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

OUTLIER_FACTOR = 10.0
OUTLIER_WINDOW = 20
"""Steps a grad norm is judged against (at least a quarter of them must precede it)."""
MIN_STEPS = 12
"""Counted steps with a finite loss needed to judge whether the loss rose (thirds of 4 steps)."""
RISE_Z = 2.33
"""Standard errors a rise must pass: the one-sided 99% bound of a loss that only fluctuates."""


def grad_norm_outliers(run: RunData) -> pd.Series:
    """The outlying grad norms (largest rank's, by step): above OUTLIER_FACTOR x the median of the
    OUTLIER_WINDOW steps before."""
    norms = run.steps.groupby("step")["grad_norm"].max()
    norms = norms[norms.map(math.isfinite)]
    before = norms.rolling(OUTLIER_WINDOW, min_periods=OUTLIER_WINDOW // 4).median().shift(1)
    return norms[norms > OUTLIER_FACTOR * before]


def loss_rise(losses: pd.Series) -> Figures:
    """`loss_steps`, `loss_rise`, `loss_rise_bound`, `risen_steps` (module docstring) of the losses in
    step order; the last three NaN with fewer than MIN_STEPS finite losses."""
    values = losses.to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    n, third = len(values), len(values) // 3
    source = "steps.parquet loss, counted steps: the last third's mean over the first third's"
    out: Figures = {"loss_steps": Figure(float(n), "steps", "steps.parquet loss, counted steps (finite)")}
    first = float(values[:third].mean()) if n >= MIN_STEPS else math.nan
    if math.isnan(first) or first == 0:
        rise = bound = risen = math.nan
    else:
        noise = float(np.diff(values).std(ddof=1)) / math.sqrt(2)  # one step's, from differences
        margin = RISE_Z * noise * math.sqrt(2 / third)  # in loss units
        rise = 100 * (float(values[-third:].mean()) - first) / abs(first)
        bound = 100 * margin / abs(first)
        risen = float((values[third:] > first + margin).sum())
    out["loss_rise"] = Figure(rise, "%", source)
    out["loss_rise_bound"] = Figure(bound, "%", f"{RISE_Z:g} standard errors of that difference, from the "
                                                "step-to-step differences of the counted steps' losses")
    out["risen_steps"] = Figure(risen, "steps", "counted steps after the first third above its mean + the bound")
    return out


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    kinds = [e.get("kind") for e in run.events]
    out: Figures = {
        name: Figure(float(kinds.count(kind)), "events", f"events.jsonl kind={kind}")
        for name, kind in (("non_finite", "non_finite"), ("rollbacks", "rollback"), ("loss_spikes", "loss_spike"),
                           ("loss_plateaus", "loss_plateau"))
    }
    out["recompiles"] = Figure(float(sum(e.get("frames", 1) for e in run.events if e.get("kind") == "recompile")),
                               "frames", "events.jsonl kind=recompile")
    out["skipped_steps"] = Figure(num(summary.get("skipped_steps")), "steps", "summary.skipped_steps")
    first, last = num(summary.get("loss_first")), num(summary.get("loss_last"))
    out["loss_change"] = Figure(100 * (last - first) / first if first else math.nan, "%",
                                "summary.loss_first -> loss_last")
    steady = run.steady_steps
    out.update(loss_rise(steady["loss"] if "loss" in steady else pd.Series(dtype=float)))
    if not run.steps.empty and "grad_norm" in run.steps:
        out["grad_norm_outliers"] = Figure(float(len(grad_norm_outliers(run))), "steps",
                                           f"steps.parquet grad_norm > {OUTLIER_FACTOR:g}x the median of the "
                                           f"{OUTLIER_WINDOW} steps before")
    return out
