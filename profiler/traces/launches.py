"""Kernel launches (HTA `get_cuda_kernel_launch_stats`): how long after its launch call a GPU event
starts, and how many GPU events are shorter than the call that launched them.

The launch delay is the GPU start minus the end of the runtime call (window.LAUNCHES: cudaLaunchKernel
and its kin, ROCm's hipLaunchKernel and kin, MTIA's), at least 0: the time the work waited once issued,
queueing included. A kernel starts only after the work ahead of it on its stream (and any event the
stream waits for), so a host running far ahead of its GPU makes the delay long: on the shared A100 job's
rank 0 (a100_16rank) a median 164 ms of its 216 ms step, as HTA reads it too, every GPU event on its busiest
stream 38 ms or more after its launch call. Only a short delay (the driver's few us) with GPU events shorter
than their launch call is host-bound evidence: the GPU finishes work faster than the host can issue it.
Returns `launch_delay_us.{mean,p50,p90}`, `short_kernel_share` (fraction of launched GPU events)
and `launches`.
"""

from __future__ import annotations

from typing import Any

from profiler.traces.window import LAUNCHES, Window


def analyze(window: Window) -> dict[str, Any]:
    calls = window.host[window.host["name"].isin(LAUNCHES)]
    pairs = calls.merge(window.gpu[["correlation", "ts", "dur"]], on="correlation", suffixes=("_cpu", "_gpu"))
    if pairs.empty:
        return {}
    delay = (pairs["ts_gpu"] - pairs["ts_cpu"] - pairs["dur_cpu"]).clip(lower=0)
    return {"launch_delay_us": {"mean": float(delay.mean()), "p50": float(delay.median()),
                                "p90": float(delay.quantile(0.9))},
            "short_kernel_share": float((pairs["dur_gpu"] < pairs["dur_cpu"]).mean()),
            "launches": int(len(pairs))}
