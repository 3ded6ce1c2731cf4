"""The GPU as its traces show it (summary.trace: imported traces, HTA's definitions), for diagnosis.

Figures, averaged over the ranks with GPU events:
- `gpu_idle` (% of the GPU's time with no kernel running, HTA temporal breakdown) and
  `device_busy` (100 - gpu_idle: replaces the operator-based estimate, which counts kernels on
  several streams twice);
- `host_wait` (% of that idle time the GPU waits for the host to launch the next kernel, HTA idle
  time breakdown);
- `launch_delay` (us, median from a launch call's end to its kernel's start, queueing behind the
  stream's earlier work included: long when the host runs ahead of its GPU) and `short_kernels`
  (% of kernels shorter than their launch call): together, a short delay and short kernels are
  evidence of a host that cannot keep up;
- `comm_exposed` (% of the GPU's time in communication no computation overlaps) and
  `comm_overlap` (% of communication overlapped), where the run has no communication counters
  of its own (summary.comm).
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean
from typing import Any

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

SOURCE = "summary.trace.ranks"


def _mean(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return fmean(values) if values else float("nan")


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    ranks = [f for f in ((summary.get("trace") or {}).get("ranks") or {}).values() if f.get("temporal")]
    if not ranks:
        return {}
    idle = 100 * _mean([num(f["temporal"].get("idle_share")) for f in ranks])
    out: Figures = {
        "gpu_idle": Figure(idle, "%", f"{SOURCE}.*.temporal.idle_share"),
        "device_busy": Figure(100 - idle, "%", f"100 - {SOURCE}.*.temporal.idle_share"),
        "host_wait": Figure(100 * _mean([num((f.get("idle") or {}).get("host_wait_share")) for f in ranks]), "%",
                            f"{SOURCE}.*.idle.host_wait_share"),
        "launch_delay": Figure(_mean([num((f.get("launch_delay_us") or {}).get("p50")) for f in ranks]), "us",
                               f"{SOURCE}.*.launch_delay_us.p50"),
        "short_kernels": Figure(100 * _mean([num(f.get("short_kernel_share")) for f in ranks]), "%",
                                f"{SOURCE}.*.short_kernel_share"),
    }
    comm = [f for f in ranks if f.get("comm_time_s")]
    if comm and not summary.get("comm"):
        out["comm_exposed"] = Figure(100 * _mean([f["comm_exposed_s"] / f["temporal"]["gpu_time_s"] for f in comm]),
                                     "%", f"{SOURCE}.*.comm_exposed_s / temporal.gpu_time_s")
        out["comm_overlap"] = Figure(100 * _mean([num(f.get("comm_overlap_share")) for f in comm]), "%",
                                     f"{SOURCE}.*.comm_overlap_share")
    return out
