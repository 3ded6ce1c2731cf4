"""What every figure shares: axis titles with units from the metric registry, the caption that says
what a figure shows, one look, and safe text.

A figure function returns a plotly `go.Figure` with its one-line caption in `layout.meta`
(`caption(fig)` reads it back), so the HTML report and the dashboard show the same words under it.
Text that came from a user (run names, config values, messages) goes into a figure through `safe`:
plotly.js reads a few HTML-like tags in labels, and escaped text is shown as typed instead.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from profiler.metrics import METRIC_BY_NAME, PHASE_NAMES

PHASE_COLORS = dict(zip(PHASE_NAMES, ("#8c564b", "#e377c2", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#7f7f7f"), strict=False))
"""One color per phase everywhere (breakdowns of a run and of a comparison alike)."""
SIDE_COLORS = {"baseline": "#7f7f7f", "candidate": "#1f77b4"}
VERDICT_COLORS = {"regressed": "#d62728", "improved": "#2ca02c", "unchanged": "#7f7f7f", "inconclusive": "#ff7f0e",
                  "confirmed": "#2ca02c", "refuted": "#d62728", "changes_numerics": "#9467bd"}
HEIGHT = 360
"""Default figure height (px): a figure and its caption fit a printed half page."""


def axis(metric: str) -> str:
    """An axis title from the metric registry: its label and unit, e.g. `time/step p50 (ms)`."""
    m = METRIC_BY_NAME[metric]
    return f"{m.label} ({m.unit})" if m.unit else m.label


def safe(text: Any) -> str:
    """User text for a plotly label: escaped, so plotly shows `<b>` as typed rather than as bold."""
    return html.escape(str(text), quote=False)


def figure(title: str, caption: str, *, height: int = HEIGHT, **layout: Any) -> go.Figure:
    """An empty figure with the shared look, its title and its caption."""
    look = {"margin": {"l": 70, "r": 30, "t": 50, "b": 50}, "legend": {"orientation": "h", "y": -0.2}}
    fig = go.Figure()
    fig.update_layout(title={"text": safe(title), "x": 0, "xanchor": "left"}, height=height,
                      template="plotly_white", meta={"caption": caption}, **{**look, **layout})
    return fig


def with_caption(fig: go.Figure, title: str, caption: str, *, height: int = HEIGHT) -> go.Figure:
    """The shared look, title and caption applied to a figure made elsewhere (subplots)."""
    fig.update_layout(title={"text": safe(title), "x": 0, "xanchor": "left"}, height=height,
                      template="plotly_white", margin={"l": 70, "r": 30, "t": 60, "b": 50},
                      legend={"orientation": "h", "y": -0.15}, meta={"caption": caption})
    return fig


def caption(fig: go.Figure) -> str:
    """The one line under a figure: what it shows."""
    meta = fig.layout.meta
    return str(meta.get("caption", "")) if isinstance(meta, dict) else ""


def title(fig: go.Figure) -> str:
    """The figure's title as plain text (for headings and the dashboard's labels)."""
    return html.unescape(fig.layout.title.text or "")
