"""Gradient communication: what is exposed (not hidden behind backward), its bytes and bandwidth.

Figures (multi-rank runs): `comm_exposed` (% of the step), `comm_overlap` (% of collective time
overlapped), `comm_mib_per_step` (MiB), `comm_bandwidth` (MiB/s, algorithm bandwidth).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

MIB = 2**20


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    comm = summary.get("comm")
    if not comm:
        return {}
    return {
        "comm_exposed": Figure(num((summary.get("phase_share") or {}).get("comm")) * 100, "%",
                               "summary.phase_share.comm"),
        "comm_overlap": Figure(num(comm.get("overlap_share")) * 100, "%", "summary.comm.overlap_share"),
        "comm_mib_per_step": Figure(num(comm.get("bytes_per_step")) / MIB, "MiB", "summary.comm.bytes_per_step"),
        "comm_bandwidth": Figure(num(comm.get("bandwidth_bytes_per_s")) / MIB, "MiB/s",
                                 "summary.comm.bandwidth_bytes_per_s"),
    }
