"""Figures of a sweep (its record, sweep.json): the ablation of each setting against the reference,
and the Pareto front of throughput against peak memory over the grid's cells.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from profiler.metrics import METRIC_BY_NAME
from profiler.settings import settings_text
from reports.plotting import axis, figure, safe

ABLATION_METRICS = {"tokens_per_s": "tokens_per_s", "peak_memory_gib": "peak_memory"}
"""A sweep's metric names -> the metric registry's (labels and units)."""


def ablation(sweep: Mapping[str, Any]) -> go.Figure | None:
    """Each setting's change against the reference value of its key, with its interval, per metric."""
    rows = list(sweep.get("ablation") or [])
    if not rows:
        return None
    rows.reverse()
    fig = figure("Ablation", "What changing one key from its reference value did, with the other keys held at "
                 "theirs: the median change over the paired runs, with its interval.",
                 height=max(300, 40 * len(rows) + 140), xaxis_title="change against the reference (%)",
                 margin={"l": 330, "r": 30, "t": 50, "b": 50})
    for metric, name in ABLATION_METRICS.items():
        picked = [r for r in rows if r.get("metric") == metric]
        if not picked:
            continue
        label = METRIC_BY_NAME[name].label
        fig.add_scatter(
            x=[r["change_pct"] for r in picked], mode="markers", name=label, marker={"size": 11},
            y=[safe(f"{r['key']}={r['value']} vs {r['reference']} ({label})") for r in picked],
            error_x={"type": "data", "symmetric": False,
                     "array": [_gap(r.get("high_pct"), r["change_pct"]) for r in picked],
                     "arrayminus": [_gap(r["change_pct"], r.get("low_pct")) for r in picked]},
            customdata=[r.get("pairs", 0) for r in picked],
            hovertemplate="%{y}: %{x:+.1f}% over %{customdata} pair(s)<extra></extra>")
    fig.add_vline(x=0, line_color="#999")
    return fig


def _gap(a: float | None, b: float | None) -> float:
    """An error bar's length; 0 where the interval is unknown (one pair)."""
    return 0.0 if a is None or b is None else a - b


def measured(cell: Mapping[str, Any]) -> bool:
    return all(isinstance((cell.get(k) or {}).get("median"), (int, float)) for k in ABLATION_METRICS)


def pareto(sweep: Mapping[str, Any]) -> go.Figure | None:
    """Every measured cell's throughput against its peak memory; the Pareto front (no other cell is both
    faster and smaller) joined and highlighted."""
    cells = [c for c in sweep.get("cells") or [] if measured(c)]
    if not cells:
        return None
    front = set(sweep.get("pareto") or [])
    fig = figure("Pareto front", "Each measured cell of the grid by peak memory and throughput (medians over its "
                 "repeats, bars from low to high); the cells no other cell beats on both are joined.",
                 xaxis_title=axis("peak_memory"), yaxis_title=axis("tokens_per_s"), height=440)
    for on_front in (False, True):
        picked = [c for c in cells if (c["index"] in front) == on_front]
        if not picked:
            continue
        if on_front:
            picked.sort(key=lambda c: c["peak_memory_gib"]["median"])
        mem = [c["peak_memory_gib"] for c in picked]
        tps = [c["tokens_per_s"] for c in picked]
        fig.add_scatter(
            x=[m["median"] for m in mem], y=[t["median"] for t in tps], name="Pareto front" if on_front else "cell",
            mode="lines+markers" if on_front else "markers",
            marker={"size": 12 if on_front else 9, "color": "#d62728" if on_front else "#7f7f7f"},
            error_x={"type": "data", "symmetric": False, "array": [m["high"] - m["median"] for m in mem],
                     "arrayminus": [m["median"] - m["low"] for m in mem]},
            error_y={"type": "data", "symmetric": False, "array": [t["high"] - t["median"] for t in tps],
                     "arrayminus": [t["median"] - t["low"] for t in tps]},
            text=[safe(f"cell {c['index']}: {settings_text(c.get('settings') or {})}") for c in picked],
            hovertemplate="%{text}<br>%{y:,.0f} tokens/s, %{x:.3f} GiB<extra></extra>")
    return fig
