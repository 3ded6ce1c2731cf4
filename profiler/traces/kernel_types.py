"""Kernel type breakdown (HTA `get_gpu_kernel_breakdown`, memory kernels included): the share of
kernel time in each kind.

Kernel time is the union, over time, of each kind's events; where kinds run at once the time is
counted once, in a category of its own. Returns `computation_share`, `communication_share`,
`memory_share` (only that kind running) and `overlapped_share` (two or more kinds at once) of
the kernel time, and `kernel_time_s`. HTA's `other` kind is left out, as in HTA.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from profiler.traces import intervals
from profiler.traces.window import COMMUNICATION, COMPUTATION, MEMORY, Window

KINDS = (COMPUTATION, COMMUNICATION, MEMORY)


def analyze(window: Window) -> dict[str, Any]:
    gpu = window.gpu
    points, deltas = [], []
    for bit, kind in enumerate(KINDS):
        part = gpu[gpu["kind"] == kind]
        s, e = intervals.merge(part["ts"].to_numpy(), part["end"].to_numpy())
        points += [s, e]
        deltas += [np.full(len(s), 1 << bit), np.full(len(e), -(1 << bit))]
    if not sum(len(p) for p in points):
        return {}
    t, d = np.concatenate(points), np.concatenate(deltas)
    order = np.lexsort((d, t))
    t, running = t[order], np.cumsum(d[order])
    spans, state = np.diff(t), running[:-1]
    total = float(spans[state > 0].sum())
    if total <= 0:
        return {}
    out = {f"{kind}_share": float(spans[state == 1 << bit].sum()) / total for bit, kind in enumerate(KINDS)}
    single = [1 << bit for bit in range(len(KINDS))]
    out["overlapped_share"] = float(spans[(state > 0) & ~np.isin(state, single)].sum()) / total
    out["kernel_time_s"] = total / 1e6
    return out
