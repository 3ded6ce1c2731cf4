"""Numerical health: non-finite values, skipped steps, loss spikes and plateaus, grad-norm outliers,
and torch.compile recompiling during the run (events.jsonl, steps.parquet).

Figures: `non_finite` (events), `skipped_steps`, `loss_spikes`, `loss_plateaus`,
`grad_norm_outliers` (steps whose grad norm is above 10x the median of the 20 steps before it: a
spike, not the fast fall of early training), `loss_change` (%
from the first to the last step), `recompiles` (frames compiled after the first step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

OUTLIER_FACTOR = 10.0
OUTLIER_WINDOW = 20
"""Steps a grad norm is judged against (at least a quarter of them must precede it)."""


def grad_norm_outliers(run: RunData) -> pd.Series:
    """The outlying grad norms (largest rank's, by step): above OUTLIER_FACTOR x the median of the
    OUTLIER_WINDOW steps before."""
    norms = run.steps.groupby("step")["grad_norm"].max()
    norms = norms[norms.map(math.isfinite)]
    before = norms.rolling(OUTLIER_WINDOW, min_periods=OUTLIER_WINDOW // 4).median().shift(1)
    return norms[norms > OUTLIER_FACTOR * before]


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    kinds = [e.get("kind") for e in run.events]
    out: Figures = {
        name: Figure(float(kinds.count(kind)), "events", f"events.jsonl kind={kind}")
        for name, kind in (("non_finite", "non_finite"), ("loss_spikes", "loss_spike"),
                           ("loss_plateaus", "loss_plateau"))
    }
    out["recompiles"] = Figure(float(sum(e.get("frames", 1) for e in run.events if e.get("kind") == "recompile")),
                               "frames", "events.jsonl kind=recompile")
    out["skipped_steps"] = Figure(num(summary.get("skipped_steps")), "steps", "summary.skipped_steps")
    first, last = num(summary.get("loss_first")), num(summary.get("loss_last"))
    out["loss_change"] = Figure(100 * (last - first) / first if first else math.nan, "%",
                                "summary.loss_first -> loss_last")
    if not run.steps.empty and "grad_norm" in run.steps:
        out["grad_norm_outliers"] = Figure(float(len(grad_norm_outliers(run))), "steps",
                                           f"steps.parquet grad_norm > {OUTLIER_FACTOR:g}x the median of the "
                                           f"{OUTLIER_WINDOW} steps before")
    return out
