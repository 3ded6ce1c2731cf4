"""Temporal breakdown (HTA `get_temporal_breakdown`): where the GPU's time goes, from its first
event's start to its last event's end.

Returns `idle_share` (no GPU event running), `compute_share` (a computation kernel running) and
`non_compute_share` (the rest: only communication, memory or other events), fractions summing to
1, and `gpu_time_s`, the span they divide. Each is a length of merged spans (busy: every event's,
compute: the computation kernels'), never a difference of overlapping sums, so none is negative.
"""

from __future__ import annotations

from typing import Any

from profiler.traces import intervals
from profiler.traces.window import COMPUTATION, Window


def analyze(window: Window) -> dict[str, Any]:
    gpu = window.gpu
    if gpu.empty:
        return {}
    busy_s, busy_e = intervals.merge(gpu["ts"].to_numpy(), gpu["end"].to_numpy())
    span = float(busy_e[-1] - busy_s[0])
    if span <= 0:
        return {}
    busy = float((busy_e - busy_s).sum())
    compute = gpu[gpu["kind"] == COMPUTATION]
    compute_time = min(intervals.length(compute["ts"].to_numpy(), compute["end"].to_numpy()), busy)
    return {"idle_share": (span - busy) / span, "compute_share": compute_time / span,
            "non_compute_share": (busy - compute_time) / span, "gpu_time_s": span / 1e6}
