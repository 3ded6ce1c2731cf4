"""Communication overlapped by computation (HTA `get_comm_comp_overlap`): of the time a
communication kernel runs, the share a computation kernel runs too.

Returns `comm_overlap_share` (fraction), `comm_time_s` (union of communication kernels) and
`comm_exposed_s` (communication time with no computation beside it), or {} without communication.
"""

from __future__ import annotations

from typing import Any

from profiler.traces import intervals
from profiler.traces.window import COMMUNICATION, COMPUTATION, Window


def analyze(window: Window) -> dict[str, Any]:
    gpu = window.gpu
    comm = gpu[gpu["kind"] == COMMUNICATION]
    if comm.empty:
        return {}
    comp = gpu[gpu["kind"] == COMPUTATION]
    comm_u = intervals.merge(comm["ts"].to_numpy(), comm["end"].to_numpy())
    comp_u = intervals.merge(comp["ts"].to_numpy(), comp["end"].to_numpy())
    comm_time = float((comm_u[1] - comm_u[0]).sum())
    if comm_time <= 0:
        return {}
    both = intervals.overlap(comm_u, comp_u)
    return {"comm_overlap_share": both / comm_time, "comm_time_s": comm_time / 1e6,
            "comm_exposed_s": (comm_time - both) / 1e6}
