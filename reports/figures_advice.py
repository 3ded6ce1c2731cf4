"""Figures of a run's health and what to do about it: the loss and grad-norm curves with stability
events, the bottlenecks with their evidence, and the recommendations with expected and verified
gains. Stored run (or its stored diagnosis) in, plotly figure out; None when there is nothing to show.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiler.analysis import OUTLIER_FACTOR, RunData, grad_norm_outliers
from profiler.settings import settings_text
from reports.plotting import VERDICT_COLORS, figure, safe, with_caption

EVENT_MARKS = {"loss_spike": ("loss spike", "triangle-up"), "loss_plateau": ("loss plateau", "line-ew-open"),
               "non_finite": ("NaN/Inf", "x"), "rollback": ("rollback", "triangle-left"),
               "recompile": ("recompile", "star")}
JUDGED = {"tokens_per_s": ("tokens_per_s", "tokens/s"), "peak_memory": ("peak_memory", "peak memory")}
"""A recommendation's `judged_by` -> (its key in `expected`, the words on the axis)."""


def stability(run: RunData) -> go.Figure | None:
    """Loss and grad norm of every step, with spikes, plateaus, NaN/Inf, skipped steps and grad-norm
    outliers marked where they happened."""
    merged = run.merged_steps
    if merged.empty or "loss" not in merged or merged["loss"].isna().all():
        return None  # an imported trace records neither loss nor grad norm
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["loss (mean over ranks)", "grad norm (before clipping, largest rank)"])
    fig.add_scatter(x=merged.index, y=merged["loss"], mode="lines+markers", name="loss", marker={"size": 4},
                    row=1, col=1, hovertemplate="step %{x}: loss %{y:.4f}<extra></extra>")
    norms = run.steps.groupby("step")["grad_norm"].max() if "grad_norm" in run.steps else merged["loss"] * math.nan
    fig.add_scatter(x=norms.index, y=norms, mode="lines+markers", name="grad norm", marker={"size": 4}, row=2, col=1,
                    hovertemplate="step %{x}: grad norm %{y:.3f}<extra></extra>")
    outliers = grad_norm_outliers(run)
    if len(outliers):
        fig.add_scatter(x=outliers.index, y=outliers, mode="markers", name=f"grad norm > {OUTLIER_FACTOR:g}x recent",
                        marker={"symbol": "circle-open", "size": 12, "color": "#d62728"}, row=2, col=1)
    if "skipped" in merged and merged["skipped"].astype(bool).any():
        skipped = merged[merged["skipped"].astype(bool)]
        fig.add_scatter(x=skipped.index, y=skipped["loss"], mode="markers", name="skipped update",
                        marker={"symbol": "square-open", "size": 12, "color": "#9467bd"}, row=1, col=1)
    for kind, (label, symbol) in EVENT_MARKS.items():
        steps = sorted({int(e["step"]) for e in run.events if e.get("kind") == kind and e.get("step") in merged.index})
        if steps:
            fig.add_scatter(x=steps, y=merged.loc[steps, "loss"], mode="markers", name=label, row=1, col=1,
                            marker={"symbol": symbol, "size": 12, "color": "#d62728"})
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="grad norm", row=2, col=1)
    return with_caption(fig, "Loss and grad norm", "The loss and gradient norm of every step, with the stability "
                        "events (loss spikes and plateaus, NaN/Inf, skipped updates, grad-norm outliers) marked "
                        "on the step they happened.", height=480)


def bottlenecks(diagnosis: Mapping[str, Any]) -> go.Figure | None:
    """Each bottleneck found by how much of the step it explains, its evidence on hover."""
    found = list(diagnosis.get("bottlenecks") or [])
    if not found:
        return None
    found.reverse()  # the most severe on top
    evidence = ["<br>".join(f"{safe(name)} = {f.get('value', math.nan):.3g} {safe(f.get('unit', ''))}"
                            for name, f in (b.get("evidence") or {}).items()) for b in found]
    fig = figure("Bottleneck evidence", "Each bottleneck the diagnosis rules found, by the share of the step it "
                 "explains; the bars' labels are the measured figures that made the rule fire.",
                 height=max(260, 70 * len(found) + 120), xaxis_title="explains (% of the step)",
                 xaxis_range=[0, 105], margin={"l": 160, "r": 30, "t": 50, "b": 50})
    fig.add_bar(x=[100 * float(b.get("severity", 0.0)) for b in found], y=[safe(b["kind"]) for b in found],
                orientation="h", text=evidence, textposition="inside", insidetextanchor="start",
                customdata=[safe(b.get("message", "")) for b in found],
                hovertemplate="%{y}: %{x:.0f}%<br>%{customdata}<extra></extra>", marker_color="#ff7f0e")
    return fig


def _interval(mid: Sequence[float], low: Sequence[float], high: Sequence[float]) -> dict[str, Any]:
    """Plotly error bars from a range around each value."""
    return {"type": "data", "symmetric": False, "array": [h - m for m, h in zip(mid, high, strict=True)],
            "arrayminus": [m - lo for m, lo in zip(mid, low, strict=True)]}


def verified(rec: Mapping[str, Any], verification: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The verification result of a recommendation (same switch and settings), or None."""
    for result in (verification or {}).get("results", []):
        if result.get("switch") == rec.get("switch") and result.get("set") == rec.get("set"):
            return result
    return None


def recommendations(recs: Sequence[Mapping[str, Any]], verification: Mapping[str, Any] | None = None
                    ) -> go.Figure | None:
    """Each recommendation's expected change in the metric it is judged by, and where a rerun verified
    it, the measured change with its interval and verdict."""
    rows = [r for r in recs if r.get("judged_by", "tokens_per_s") in JUDGED
            and JUDGED[r.get("judged_by", "tokens_per_s")][0] in (r.get("expected") or {})]
    if not rows:
        return None
    rows.reverse()  # the best on top
    labels = [safe(f"{settings_text(r['set'])} ({JUDGED[r.get('judged_by', 'tokens_per_s')][1]})") for r in rows]
    fig = figure("Recommendations: expected and verified gains", "Each recommended change's expected effect on the "
                 "metric it is judged by (the range Amdahl's law gives over the measured breakdown); where it was "
                 "verified by rerunning, the measured change with its interval, colored by verdict.",
                 height=max(280, 60 * len(rows) + 140), xaxis_title="change (%)", barmode="group",
                 margin={"l": 330, "r": 30, "t": 50, "b": 50})
    exp = [r["expected"][JUDGED[r.get("judged_by", "tokens_per_s")][0]] for r in rows]
    mid = [(e["low"] + e["high"]) / 2 for e in exp]
    fig.add_bar(x=mid, y=labels, orientation="h", name="expected", marker_color="#9ecae1",
                error_x=_interval(mid, [e["low"] for e in exp], [e["high"] for e in exp]),
                hovertemplate="expected %{x:+.1f}%<extra></extra>")
    results = [verified(r, verification) or {} for r in rows]
    if any(results):
        measured = [res.get("measured") or {"change_pct": 0.0, "low_pct": 0.0, "high_pct": 0.0} for res in results]
        change = [m["change_pct"] for m in measured]
        fig.add_bar(x=change, y=labels, orientation="h", name="verified",
                    marker_color=[VERDICT_COLORS.get(res.get("verdict", ""), "#7f7f7f") for res in results],
                    text=[safe(res.get("verdict", "not verified")) for res in results], textposition="outside",
                    error_x=_interval(change, [m["low_pct"] for m in measured], [m["high_pct"] for m in measured]),
                    hovertemplate="measured %{x:+.1f}% (%{text})<extra></extra>")
    fig.add_vline(x=0, line_color="#333")
    return fig
