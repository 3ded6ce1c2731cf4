"""Idle time breakdown (HTA `get_idle_time_breakdown`): why each CUDA stream waits between kernels.

On each stream, the gap before a kernel (from the latest end of the kernels before it on the stream)
is
- host wait when the kernel's launch (its runtime call) began after that end: the host did not
  enqueue work fast enough;
- kernel wait when it is shorter than `KERNEL_WAIT_US` otherwise: the cost of back-to-back launches;
- other otherwise (waiting on another stream, an event, a synchronization).
A kernel that starts before the stream's earlier work ends (MTIA's DMA transfers run beside its
kernels on one stream) has no gap; HTA subtracts the previous kernel's end alone, and its overlaps
count as negative idle time. Kernels without a launch (no `correlation`) are never host wait.
Returns `host_wait_share`, `kernel_wait_share`, `other_share` (fractions of the gaps summed over
streams) and `idle_time_s` (that sum).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from profiler.traces.window import Window

KERNEL_WAIT_US = 30
"""HTA's default `consecutive_kernel_delay` (its docstring says ns; its times are us)."""


def analyze(window: Window) -> dict[str, Any]:
    gpu = window.gpu[window.gpu["is_kernel"]]
    if gpu.empty:
        return {}
    launch = window.host.drop_duplicates("correlation").set_index("correlation")["ts"]
    gpu = gpu.assign(launch_ts=gpu["correlation"].map(launch).fillna(-np.inf).to_numpy())
    totals = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    for _, s in gpu.sort_values("ts", kind="stable").groupby("stream", sort=False):
        prev_end = np.concatenate([[np.nan], np.maximum.accumulate(s["end"].to_numpy())[:-1]])
        gap = np.maximum(s["ts"].to_numpy() - prev_end, 0.0)
        valid = ~np.isnan(gap)
        host = s["launch_ts"].to_numpy() > prev_end
        kernel = ~host & (gap < KERNEL_WAIT_US)
        totals["host_wait"] += float(gap[valid & host].sum())
        totals["kernel_wait"] += float(gap[valid & kernel].sum())
        totals["other"] += float(gap[valid & ~host & ~kernel].sum())
    idle = sum(totals.values())
    if idle <= 0:
        return {}
    return {**{f"{k}_share": v / idle for k, v in totals.items()}, "idle_time_s": idle / 1e6}
