"""The report of a comparison: the gate's verdict first, then the figures (changes per metric, step-time
distributions, breakdowns side by side, config diff), then the tables. The numbers are
`profiler.compare.runs.compare`'s, as `glmperf compare` prints them.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence

import plotly.graph_objects as go

from profiler.analysis import RunData
from profiler.compare.formats import STEPS_NOTE, headline, workload_line
from profiler.compare.runs import Comparison
from profiler.metrics import METRIC_BY_NAME
from profiler.text import fmt
from reports import figures_compare, html


def _pct(x: float) -> str:
    return f"{x:+.1%}" if math.isfinite(x) else "n/a"


def metric_rows(c: Comparison) -> list[list[str]]:
    rows = []
    for m in c.metrics:
        e, digits = m.estimate, METRIC_BY_NAME[m.name].digits
        rows.append([m.label, m.unit, fmt(e.base, digits), fmt(e.cand, digits), _pct(e.change),
                     f"[{_pct(e.ci[0])}, {_pct(e.ci[1])}]", f"{e.p_value:.2g}" if math.isfinite(e.p_value) else "n/a",
                     f"{'gate' if m.threshold.gated else 'shown'} {m.threshold.text}", e.verdict,
                     "; ".join([e.reason, *e.stability])])
    return rows


def _contention(c: Comparison) -> str:
    if c.contention == (None, None):
        return "not measured"
    base, cand = ("n/a" if x is None else f"{x:.0%}" for x in c.contention)
    return f"baseline {base}, candidate {cand} (other processes' share of the machine beyond what a run left free)"


def compare_figures(base: Sequence[RunData], cand: Sequence[RunData], c: Comparison
                    ) -> list[tuple[str, go.Figure | None, str]]:
    """Every figure of a comparison's report in order: (name, figure or None, why it would be missing);
    the HTML report and the dashboard show these."""
    return [
        ("Change per metric", figures_compare.metric_deltas(c), "no metric compared"),
        ("Step-time distributions", figures_compare.step_distributions(base, cand), "a side has no counted step"),
        ("Breakdowns side by side", figures_compare.breakdowns(c), "no phase measured"),
        ("Config diff", figures_compare.config_diff(c), "the sides' config and environment agree"),
    ]


def compare_report(base: Sequence[RunData], cand: Sequence[RunData], c: Comparison) -> str:
    """The HTML report of `c`, the comparison of the `base` runs with the `cand` runs."""
    shown, missing = html.sections(compare_figures(base, cand, c))
    what = [("baseline", f"{len(c.base)} run(s): {', '.join(c.base)}"),
            ("candidate", f"{len(c.cand)} run(s): {', '.join(c.cand)}"),
            ("statistics", f"{100 * c.options.confidence:g}% intervals; {STEPS_NOTE}"),
            ("CPU contention", _contention(c))]
    return html.render(
        "compare.html", title=f"glmperf: {c.base[0]} vs {c.cand[0]}", sections=shown, missing=missing,
        base=list(c.base), cand=list(c.cand), verdict=c.verdict, failed=bool(c.failures), headline=headline(c),
        banners=[line for line in (workload_line(c), c.across_devices) if line],
        parity=f"{c.parity.verdict}: {c.parity.reason}", what=what, metrics=metric_rows(c),
        phases=[[p.name, fmt(p.base_ms, 2), fmt(p.cand_ms, 2), f"{p.change_ms:+.2f}"] for p in c.phases],
        ops=[[o.name, fmt(o.base_ms, 3), fmt(o.cand_ms, 3), f"{o.change_ms:+.3f}"] for o in c.ops], ops_time=c.ops_time,
        differences=[[d.section, d.key, str(d.base), str(d.cand)] for d in c.differences], notes=list(c.notes),
        written=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
