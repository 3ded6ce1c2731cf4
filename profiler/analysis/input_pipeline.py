"""The input pipeline: how long steps wait for data, and what the loader reads from storage.

Figures: `data_wait` (% of the step), `data_wait_ms` (ms per step), `read_mib_per_s` (MiB/s read
from storage by the ranks and their loader workers, CPU sampler), `loader_workers` (per rank).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

MIB = 2**20


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    share = num((summary.get("phase_share") or {}).get("data"))
    mean_ms = num((summary.get("step_time_s") or {}).get("mean")) * 1e3
    io = summary.get("io") or {}
    workers = (run.config.get("switches") or {}).get("dataloader", {}).get("num_workers")
    return {
        "data_wait": Figure(share * 100, "%", "summary.phase_share.data"),
        "data_wait_ms": Figure(share * mean_ms, "ms", "summary.phase_share.data x step_time_s.mean"),
        "read_mib_per_s": Figure(num(io.get("read_bytes_per_s")) / MIB, "MiB/s", "summary.io.read_bytes_per_s"),
        "loader_workers": Figure(num(workers), "workers", "config.switches.dataloader.num_workers"),
    }
