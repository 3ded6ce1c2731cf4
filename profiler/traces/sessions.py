"""A worker's several profiling sessions read as one rank.

`torch.profiler.tensorboard_trace_handler` writes a file per profiling session of a worker,
`<worker>.<ms>.pt.trace.json[.gz]`, minutes apart. Each session is analyzed as the trace it is (its own
HTA window: the last step of each session left out, the time between sessions nobody's idle time), and
the rank's figures combine them. Totals (times, counts, steps) add up; a share or a mean is weighted by
the total it is of: temporal shares by GPU time, kernel shares by kernel time, idle shares by idle time,
the overlap by communication time, the launch figures by launches (so the delay percentiles are the
launch-weighted means of the sessions'), the collectives (per step) by steps, each over the sessions that
have the figure. The rank's steps are every session's, numbered as its trace numbers them (a session
whose numbers do not follow the earlier one's is renumbered to follow them); its operators and kernels
are summed by name over the sessions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

SESSION = re.compile(r"^(?P<worker>.+)\.(?P<ms>\d{10,})\.pt\.trace\.json(\.gz)?$")
"""tensorboard_trace_handler's file name: `<worker>.<milliseconds>.pt.trace.json[.gz]`."""
TOTALS = {"temporal": "gpu_time_s", "kernels": "kernel_time_s", "idle": "idle_time_s"}
"""Figure groups whose shares are of a total in the group itself."""
OF = {"comm_overlap_share": "comm_time_s", "launch_delay_us": "launches", "short_kernel_share": "launches",
      "collectives": "steps"}
"""Figures that are shares or means of a rank's total figure."""
TABLE_KEYS = {"ops": ["rank", "name", "input_shapes"], "kernels": ["rank", "name"]}
TABLE_HOW = {"min_s": "min", "max_s": "max", "stream": "first", "kind": "first"}
"""How a table column combines over sessions where it is not summed (`stream`: the one of the session
with the most calls)."""

Session = tuple[Path, dict[str, Any], dict[str, pd.DataFrame]]
"""A session's file, figures and table rows (profiler.traces.summary.analyze_rank)."""


def _worker(path: Path) -> str | None:
    found = SESSION.match(path.name)
    return str(path.parent / found["worker"]) if found else None


def _ms(path: Path) -> int:
    found = SESSION.match(path.name)
    return int(found["ms"]) if found else 0


def worker_rank(path: Path, paths: Mapping[int, Path]) -> int | None:
    """The rank read from another profiling session of the worker whose session `path` is, or None."""
    worker = _worker(path)
    return next((rank for rank, other in paths.items() if worker and _worker(other) == worker), None)


def _weighted(values: list[Any], weights: list[float]) -> Any:
    """Numbers weighted by `weights` (an int is a count: summed), dicts key by key (a figure a session lacks
    counts 0 there), anything else the first session's."""
    first = next(v for v in values if v is not None)
    if isinstance(first, Mapping):
        keys = dict.fromkeys(k for v in values if v is not None for k in v)
        return {k: _weighted([None if v is None else v.get(k) for v in values], weights) for k in keys}
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first
    numbers = [0 if v is None else v for v in values]
    if isinstance(first, int):
        return sum(numbers)
    weight = sum(weights)
    return sum(v * w for v, w in zip(numbers, weights, strict=True)) / weight if weight > 0 else math.nan


def _figures(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's figures (summary.trace.ranks.<rank>) from its sessions' (module docstring)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for figures in sessions for k in figures):
        have = [figures for figures in sessions if key in figures]
        values = [figures[key] for figures in have]
        if key in TOTALS:
            totals = [value.get(TOTALS[key], 0.0) for value in values]
            group = _weighted(values, totals)
            out[key] = {**group, TOTALS[key]: sum(totals)} if group else group
        elif key in OF:
            out[key] = _weighted(values, [figures.get(OF[key], 0) for figures in have])
        elif isinstance(values[0], (int, float)) and not isinstance(values[0], bool):  # a total: steps, times
            out[key] = sum(values)
        else:
            out[key] = values[0]
    return out


def _steps(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The sessions' steps, a session's renumbered to follow the earlier ones' where its numbers do not."""
    out: list[pd.DataFrame] = []
    for frame in (f for f in frames if not f.empty):
        last = out[-1]["step"].max() if out else None
        if last is not None and frame["step"].min() <= last:
            frame = frame.assign(step=frame["step"] - frame["step"].min() + last + 1)
        out.append(frame)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _summed(frames: list[pd.DataFrame], keys: list[str], steps: int) -> pd.DataFrame:
    """Operator or kernel rows of the sessions, one row per `keys`, over all the rank's `steps`."""
    present = [f for f in frames if not f.empty]
    if not present:
        return pd.DataFrame()
    rows = pd.concat(present, ignore_index=True).sort_values("calls", ascending=False, kind="stable")
    how = {c: TABLE_HOW.get(c, "sum" if pd.api.types.is_numeric_dtype(rows[c]) else "first")
           for c in rows.columns if c not in keys}
    out = rows.groupby(keys, as_index=False, sort=False).agg(how)
    if "mean_s" in out:
        out["mean_s"] = out["time_s"] / out["calls"]
    return out.assign(steps=steps)[rows.columns]


def combine(sessions: list[Session]) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """One rank's figures and table rows from its sessions' (one session: its own); the figures name
    the sessions' files (`sessions`)."""
    if len(sessions) == 1:
        return sessions[0][1], sessions[0][2]
    sessions = sorted(sessions, key=lambda session: _ms(session[0]))
    figures = {**_figures([figures for _, figures, _ in sessions]), "sessions": [str(p) for p, _, _ in sessions]}
    tables = {name: _steps([rows[name] for _, _, rows in sessions]) if name == "steps" else
              _summed([rows[name] for _, _, rows in sessions], TABLE_KEYS[name], figures["steps"])
              for name in sessions[0][2]}
    return figures, tables
