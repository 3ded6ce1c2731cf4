"""Trace diff (HTA `TraceDiff.compare_traces`): which operators and GPU kernels changed how often
they run, or how long, between two sides of a comparison of imported runs.

    diff = trace_diff(control_runs, test_runs)     # a DataFrame, or empty when a side has no table
    most_changed(diff, n)                          # the n rows whose time, and the n whose count, changed most

Columns, per name and per profiled step (each side: its tables' totals over all its ranks' steps):
`kind` (`operator`: host operators of ops.parquet; `kernel`: kernels.parquet), `name`,
`control_calls`, `test_calls`, `diff_calls`, `control_ms`, `test_ms`, `diff_ms` (self CPU time for
operators, GPU time for kernels). `ProfilerStep#N` rows are left out (each step has its own name).
Pure over loaded runs: no I/O, no printing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd

from profiler.analysis import RunData
from profiler.store import json_text

COLUMNS = ["kind", "name", "control_calls", "test_calls", "diff_calls", "control_ms", "test_ms", "diff_ms"]


def _per_step(tables: Sequence[pd.DataFrame], time_column: str) -> pd.DataFrame:
    """calls and ms per step by name, over every rank of every run of a side."""
    frames = [t for t in tables if not t.empty]
    if not frames:
        return pd.DataFrame(columns=["calls", "ms"])
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[~rows["name"].str.startswith("ProfilerStep#")]
    steps = sum(float(t.groupby("rank")["steps"].first().sum()) for t in frames)
    totals = rows.groupby("name")[["calls", time_column]].sum()
    return pd.DataFrame({"calls": totals["calls"] / steps, "ms": totals[time_column] * 1e3 / steps})


def _diff(control: pd.DataFrame, test: pd.DataFrame, kind: str) -> pd.DataFrame:
    both = control.add_suffix("_c").join(test.add_suffix("_t"), how="outer").fillna(0.0)
    return pd.DataFrame({"kind": kind, "name": both.index, "control_calls": both["calls_c"],
                         "test_calls": both["calls_t"], "diff_calls": both["calls_t"] - both["calls_c"],
                         "control_ms": both["ms_c"], "test_ms": both["ms_t"],
                         "diff_ms": both["ms_t"] - both["ms_c"]}).reset_index(drop=True)


def trace_diff(control: Sequence[RunData], test: Sequence[RunData]) -> pd.DataFrame:
    parts = []
    for kind, table, column in (("operator", "ops", "self_cpu_s"), ("kernel", "kernels", "time_s")):
        c = [getattr(r, table) for r in control]
        t = [getattr(r, table) for r in test]
        if all(x.empty for x in c) or all(x.empty for x in t):
            continue
        parts.append(_diff(_per_step(c, column), _per_step(t, column), kind))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)


def most_changed(diff: pd.DataFrame, n: int = 5) -> dict[str, pd.DataFrame]:
    """Per kind, the `n` names whose time changed most and the `n` whose count changed most."""
    out = {}
    for kind, rows in diff.groupby("kind", sort=False):
        out[f"{kind}s by time"] = rows.reindex(rows["diff_ms"].abs().sort_values(ascending=False).index).head(n)
        out[f"{kind}s by count"] = rows.reindex(rows["diff_calls"].abs().sort_values(ascending=False).index).head(n)
    return out


def to_text(diff: pd.DataFrame, n: int = 5) -> str:
    """The most changed operators and kernels, for `glmperf compare`'s text output."""
    lines = []
    for title, rows in most_changed(diff, n).items():
        lines += ["", f"trace diff: {title} (per profiled step: calls, ms; control -> test):"]
        for r in rows.itertuples():
            lines.append(f"  {r.name[:70]:70}  {r.control_calls:8.1f} -> {r.test_calls:8.1f} calls  "
                         f"{r.control_ms:9.3f} -> {r.test_ms:9.3f} ms ({r.diff_ms:+.3f})")
    return "\n".join(lines) + "\n" if lines else ""


def with_trace_diff(rendered: str, fmt: str, diff: pd.DataFrame) -> str:
    """A compare output with the trace diff added: text and markdown get the listing, JSON a
    `trace_diff` key (every row); other formats are left as they are."""
    if diff.empty:
        return rendered
    if fmt == "json":
        data = json.loads(rendered)
        data["trace_diff"] = diff.to_dict(orient="records")
        return json_text(data) + "\n"
    if fmt == "markdown":
        return rendered + "\n```" + to_text(diff) + "```\n"
    if fmt == "text":
        return rendered + to_text(diff)
    return rendered
