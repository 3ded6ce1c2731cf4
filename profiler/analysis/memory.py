"""Peak memory against the capacity the run must fit in.

Capacity: `profile.memory_budget_gb` when set, else the GPU's memory on CUDA, else the machine's
RAM. Figures: `peak_memory` (GiB), `memory_capacity` (GiB), `memory_use` (% of the capacity), and
`step_memory` (% of the peak that the steps add to what was held when training started: the model
and, on CPU, the runtime's own memory, which no switch of the step frees; the optimizer's state,
made at the first step, counts as the steps'). The step timer records the memory at start
(rank status `instruments.StepTimer.memory_at_start_bytes`); runs stored before it lack the figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

GIB = 2**30


def capacity(run: RunData) -> tuple[float, str]:
    """The bytes the run must fit in, and which figure says so."""
    if run.memory_budget_gb > 0:
        return run.memory_budget_gb * GIB, "config.profile.memory_budget_gb"
    env = run.environment
    if num(env.get("device_memory_bytes")) > 0:
        return num(env["device_memory_bytes"]), "environment.device_memory_bytes"
    return num(env.get("memory_total_bytes")), "environment.memory_total_bytes (the machine's RAM)"


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    peak = num(summary.get("peak_memory_bytes"))
    cap, source = capacity(run)
    starts = [num(((r.get("instruments") or {}).get("StepTimer") or {}).get("memory_at_start_bytes"))
              for r in run.ranks]
    start = max(starts) if starts and all(map(math.isfinite, starts)) else float("nan")
    return {
        "peak_memory": Figure(peak / GIB, "GiB", f"summary.peak_memory_bytes ({summary.get('peak_memory_source')})"),
        "memory_capacity": Figure(cap / GIB, "GiB", source),
        "memory_use": Figure(100 * peak / cap if cap > 0 else float("nan"), "%",
                             f"summary.peak_memory_bytes / {source}"),
        "step_memory": Figure(100 * (peak - start) / peak if peak > 0 and start >= 0 else float("nan"), "%",
                              "(summary.peak_memory_bytes - memory at start) / peak; memory at start: "
                              "ranks[].instruments.StepTimer.memory_at_start_bytes (largest rank)"),
    }
