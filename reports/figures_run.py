"""Figures of one run's time, speed and memory: stored run in, plotly figure out (None when the run
has nothing to show for it).

Steps are the loaded run's views (`RunData.merged_steps`: ranks merged into the slowest rank's row;
`RunData.steady_steps`: what the summary counts), with warmup, compile and profiled steps marked as
left out, so a figure and the summary table agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiler.analysis import RunData, capacity
from profiler.metrics import METRIC_BY_NAME, PHASES
from reports.plotting import PHASE_COLORS, axis, figure, with_caption

GIB = 2**30
OFF_SCALE = 4.0
"""A capacity this many times the peak is stated, not drawn."""


def _excluded(run: RunData) -> dict[str, pd.Index]:
    """The steps left out of the summary, by why."""
    merged, warmup = run.merged_steps, run.warmup_steps
    out = {f"warmup (first {warmup})": merged.index[merged.index < merged.index.min() + warmup]}
    for column, label in (("warmup", "compile"), ("profiled", "profiled (torch.profiler window)")):
        if column in merged:
            out[label] = merged.index[merged[column].astype(bool).to_numpy()]
    return {k: v for k, v in out.items() if len(v)}


def step_breakdown(run: RunData, summary: Mapping[str, Any]) -> go.Figure | None:
    """Mean ms a step in each phase, stacked: the summary's critical path and, with several ranks, each
    rank's own counted steps."""
    if run.merged_steps.empty or not summary.get("steps_counted"):
        return None
    mean_ms = 1e3 * float((summary.get("step_time_s") or {}).get("mean", 0.0))
    shares = summary.get("phase_share") or {}
    bars: dict[str, dict[str, float]] = {"step (slowest rank)" if run.world_size > 1 else "mean step":
                                         {p.name: mean_ms * float(shares.get(p.name, 0.0)) for p in PHASES}}
    if run.world_size > 1:
        counted = run.steps[run.steps["step"].isin(run.steady_steps.index)]
        for rank, rows in counted.groupby("rank"):
            bars[f"rank {int(rank)}"] = {p.name: 1e3 * float(rows[p.column].mean()) for p in PHASES if p.column in rows}
    fig = figure("Step-time breakdown", "Where a counted step's time goes, phase by phase (mean ms a step); "
                 "with several ranks, each rank's own phases beside the slowest rank's critical path.",
                 barmode="stack", yaxis_title="time (ms per step)")
    for p in PHASES:
        fig.add_bar(name=p.name, x=list(bars), y=[b.get(p.name, 0.0) for b in bars.values()],
                    marker_color=PHASE_COLORS[p.name], hovertemplate=f"{p.name}: %{{y:.2f}} ms<extra></extra>")
    return fig


def step_times(run: RunData) -> go.Figure | None:
    """Each step's time over the run, per rank, with the steps the summary leaves out marked."""
    merged = run.merged_steps
    if merged.empty:
        return None
    fig = figure("Step time over the run", "Every step's time (per rank when several); warmup, compile and "
                 "profiled steps, which the summary leaves out, are marked.",
                 xaxis_title="step", yaxis_title=f"time/step ({METRIC_BY_NAME['step_time_p50'].unit})")
    for rank, rows in run.steps.sort_values("step").groupby("rank"):
        fig.add_scatter(x=rows["step"], y=rows["step_s"] * 1e3, mode="lines+markers", name=f"rank {int(rank)}",
                        marker={"size": 4}, hovertemplate="step %{x}: %{y:.1f} ms<extra></extra>")
    for (label, steps), symbol in zip(_excluded(run).items(), ("x", "diamond-open", "square-open"),
                                      strict=False):
        fig.add_scatter(x=list(steps), y=merged.loc[steps, "step_s"] * 1e3, mode="markers", name=label,
                        marker={"symbol": symbol, "size": 10, "color": "#d62728"},
                        hovertemplate=f"{label}: step %{{x}}<extra></extra>")
    return fig


def throughput(run: RunData, summary: Mapping[str, Any]) -> go.Figure | None:
    """Tokens/s of each step (all ranks) and its MFU, with the run's figures as lines."""
    merged = run.merged_steps
    if merged.empty:
        return None
    tps, mfu = METRIC_BY_NAME["tokens_per_s"], METRIC_BY_NAME["mfu"]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=merged.index, y=tps.steps(merged, summary), mode="lines+markers", name="tokens/s",
                    marker={"size": 4}, hovertemplate="step %{x}: %{y:,.0f} tokens/s<extra></extra>")
    fig.add_scatter(x=merged.index, y=mfu.steps(merged, summary), mode="lines", name="MFU",
                    line={"dash": "dot"}, secondary_y=True, hovertemplate="step %{x}: %{y:.2f}%<extra></extra>")
    if summary.get("steps_counted"):
        fig.add_hline(y=tps.value(summary), line_dash="dash", line_color="#2ca02c",
                      annotation_text=f"run: {tps.value(summary):,.0f} tokens/s", annotation_position="top left")
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text=axis("tokens_per_s"), secondary_y=False)
    fig.update_yaxes(title_text=axis("mfu"), secondary_y=True, rangemode="tozero")
    peak = summary.get("peak_flops")
    peak_text = f"{peak / 1e9:,.0f} GFLOP/s" if isinstance(peak, (int, float)) else "not measured"
    return with_caption(fig, "Throughput and MFU", "Tokens per second of each step over all ranks, and the "
                        f"model FLOP/s it means over the devices' peak (MFU; peak {peak_text} a device, "
                        f"{summary.get('devices', 1)} device(s)); the dashed line is the run's figure.")


def memory(run: RunData) -> go.Figure | None:
    """Each step's peak memory per rank against the capacity the run must fit in."""
    merged, source = run.merged_steps, run.memory_source
    if merged.empty or merged["peak_memory_bytes"].isna().all():
        return None
    cap, cap_source = capacity(run)
    fig = figure("Memory over the run", f"Each step's peak memory ({source}) per rank, against the capacity "
                 f"the run must fit in ({cap_source}).", xaxis_title="step", yaxis_title=axis("peak_memory"),
                 yaxis_rangemode="tozero")
    column = {"torch.cuda.max_memory_allocated": "mem_alloc_peak_bytes",
              "process RSS high-water mark (CPU)": "rss_peak_bytes"}.get(source, "rss_bytes")
    for rank, rows in run.steps.sort_values("step").groupby("rank"):
        fig.add_scatter(x=rows["step"], y=rows[column] / GIB, mode="lines+markers", name=f"rank {int(rank)}",
                        marker={"size": 4}, hovertemplate="step %{x}: %{y:.3f} GiB<extra></extra>")
    peak = float(merged["peak_memory_bytes"].max())
    if cap >= OFF_SCALE * peak:  # drawn, the line would flatten the curve: say it instead
        fig.add_annotation(text=f"capacity {cap / GIB:,.1f} GiB, off the scale: the peak uses {100 * peak / cap:.1f}%",
                           xref="paper", yref="paper", x=0, y=1.08, showarrow=False, xanchor="left")
    elif cap == cap:  # not NaN
        fig.add_hline(y=cap / GIB, line_dash="dash", line_color="#d62728",
                      annotation_text=f"capacity {cap / GIB:,.1f} GiB", annotation_position="bottom left")
    return fig
