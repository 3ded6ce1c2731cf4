"""Figures of a comparison (profiler.compare.runs.compare): per-metric changes with intervals and
verdicts, the step-time distributions overlaid, the breakdowns side by side, and the config diff.
Comparison (and the stored runs it compared) in, plotly figure out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from profiler.analysis import RunData
from profiler.compare.runs import Comparison
from profiler.metrics import METRIC_BY_NAME
from reports.plotting import PHASE_COLORS, SIDE_COLORS, VERDICT_COLORS, figure, safe


def _pct(x: float) -> float | None:
    return 100 * x if math.isfinite(x) else None


def metric_deltas(c: Comparison) -> go.Figure | None:
    """Each compared metric's change, candidate over baseline, with its interval, threshold and verdict."""
    if not c.metrics:
        return None
    ms = list(reversed(c.metrics))
    labels = [f"{m.label} ({m.unit})" + ("" if m.threshold.gated else ", shown") for m in ms]
    change = [_pct(m.estimate.change) for m in ms]
    low = [_pct(m.estimate.ci[0]) for m in ms]
    high = [_pct(m.estimate.ci[1]) for m in ms]
    fig = figure("Change per metric", f"Each metric's change from baseline to candidate with its "
                 f"{100 * c.options.confidence:g}% interval, colored by verdict; the crosses are the thresholds in "
                 "each metric's bad direction (metrics marked 'shown' are reported, never failing).",
                 height=max(300, 45 * len(ms) + 140), xaxis_title="change, candidate vs baseline (%)",
                 margin={"l": 230, "r": 30, "t": 50, "b": 50})
    fig.add_scatter(
        x=change, y=labels, mode="markers", name="change", marker={"size": 11, "color": [
            VERDICT_COLORS.get(m.estimate.verdict, "#7f7f7f") for m in ms]},
        error_x={"type": "data", "symmetric": False,
                 "array": [h - x if h is not None and x is not None else 0 for h, x in zip(high, change, strict=True)],
                 "arrayminus": [x - lo if lo is not None and x is not None else 0 for lo, x in zip(low, change,
                                                                                                     strict=True)]},
        customdata=[[m.estimate.verdict, m.estimate.base, m.estimate.cand, safe(m.estimate.reason)] for m in ms],
        hovertemplate="%{y}: %{x:+.1f}% (%{customdata[0]})<br>%{customdata[1]:.4g} -> %{customdata[2]:.4g}"
                      "<br>%{customdata[3]}<extra></extra>")
    sign = [1 if METRIC_BY_NAME[m.name].better == "lower" else -1 for m in ms]
    fig.add_scatter(x=[s * 100 * m.threshold.limit for s, m in zip(sign, ms, strict=True)], y=labels, mode="markers",
                    name="threshold", marker={"symbol": "x-thin", "size": 12, "line": {"width": 2, "color": "#333"}},
                    hovertemplate="threshold %{x:+.1f}%<extra></extra>")
    fig.add_vline(x=0, line_color="#999")
    return fig


def _steady_ms(runs: Sequence[RunData]) -> np.ndarray:
    frames = [r.steady_steps["step_s"] for r in runs if not r.merged_steps.empty]
    return 1e3 * pd.concat(frames).to_numpy() if frames else np.array([])


def step_distributions(base: Sequence[RunData], cand: Sequence[RunData]) -> go.Figure | None:
    """The counted steps' times of each side, overlaid, with each side's median."""
    sides = {"baseline": _steady_ms(base), "candidate": _steady_ms(cand)}
    if not all(len(x) for x in sides.values()):
        return None
    unit = METRIC_BY_NAME["step_time_p50"].unit
    fig = figure("Step-time distributions", "The counted steps' times of the baseline and candidate runs "
                 "overlaid (share of each side's steps), with each side's median dashed.", barmode="overlay",
                 xaxis_title=f"time/step ({unit})", yaxis_title="share of the side's steps")
    for side, ms in sides.items():
        fig.add_histogram(x=ms, name=f"{side} ({len(ms)} steps)", histnorm="probability", opacity=0.55,
                          marker_color=SIDE_COLORS[side], nbinsx=30)
        fig.add_vline(x=float(np.median(ms)), line_dash="dash", line_color=SIDE_COLORS[side])
    return fig


def breakdowns(c: Comparison) -> go.Figure | None:
    """The mean ms a step of each phase on each side, stacked, side by side."""
    if not c.phases:
        return None
    fig = figure("Breakdowns side by side", "Where a counted step's time goes on each side, phase by phase (mean "
                 "ms a step over the side's runs); the stacks add up to the mean step time.", barmode="stack",
                 yaxis_title="time (ms per step)")
    for p in c.phases:
        fig.add_bar(name=p.name, x=["baseline", "candidate"], y=[p.base_ms, p.cand_ms],
                    marker_color=PHASE_COLORS.get(p.name, "#7f7f7f"),
                    hovertemplate=f"{p.name}: %{{y:.2f}} ms<extra></extra>")
    return fig


def config_diff(c: Comparison) -> go.Figure | None:
    """The config and environment keys whose values differ between the two sides' first runs."""
    if not c.differences:
        return None
    rows = [[d.section, d.key, d.base, d.cand] for d in c.differences]
    fig = figure("Config diff", "The config and environment values that differ between the baseline's and the "
                 "candidate's first runs.", height=min(900, 24 * len(rows) + 90),
                 margin={"l": 20, "r": 20, "t": 50, "b": 20})
    fig.add_table(header={"values": ["section", "key", "baseline", "candidate"], "align": "left",
                          "fill_color": "#eee"},
                  cells={"values": [[safe(r[i]) for r in rows] for i in range(4)], "align": "left"},
                  columnwidth=[1, 3, 3, 3])
    return fig
