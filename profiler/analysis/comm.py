"""Communication: what is exposed (not hidden behind computation), its bytes and bandwidth, by collective.

Figures (multi-rank runs): `comm_exposed` (% of the step), `comm_overlap` (% of collective time
overlapped), `comm_mib_per_step` (MiB), `comm_bandwidth` (MiB/s, algorithm bandwidth).

DDP runs measure their gradient all-reduce with a communication hook (summary.comm: every step;
their traces' kinds are left out, since the profiled window would give another exposed share).
Other layouts (fsdp, tp, pp) are read from the traces' collectives (summary.trace.ranks.*.collectives,
profiler.traces.collectives: the profiled steps, averaged over the ranks), which also give each kind
its own figure: `comm_exposed.<kind>` (% of the step no computation overlaps, e.g.
`comm_exposed.send_recv`, where a pipeline stage waits for its neighbour) and `comm_mib.<kind>`.
On CUDA the GPU's figures (analysis.gpu_trace) give the totals; the kinds are added here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

MIB = 2**20
SOURCE = "summary.trace.ranks.*.collectives"


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return fmean(values) if values else math.nan


def _hooked(summary: Mapping[str, Any], comm: Mapping[str, Any]) -> Figures:
    return {
        "comm_exposed": Figure(num((summary.get("phase_share") or {}).get("comm")) * 100, "%",
                               "summary.phase_share.comm"),
        "comm_overlap": Figure(num(comm.get("overlap_share")) * 100, "%", "summary.comm.overlap_share"),
        "comm_mib_per_step": Figure(num(comm.get("bytes_per_step")) / MIB, "MiB", "summary.comm.bytes_per_step"),
        "comm_bandwidth": Figure(num(comm.get("bandwidth_bytes_per_s")) / MIB, "MiB/s",
                                 "summary.comm.bandwidth_bytes_per_s"),
    }


def _sum(kinds: Mapping[str, Mapping[str, float]], field: str) -> float:
    return sum(num(k.get(field)) for k in kinds.values() if not math.isnan(num(k.get(field))))


def _traced(ranks: Sequence[Mapping[str, Any]], totals: bool) -> Figures:
    out: Figures = {}
    names = sorted({kind for r in ranks for kind in r["kinds"]})
    for kind in names:
        present = [r for r in ranks if kind in r["kinds"]]
        out[f"comm_exposed.{kind}"] = Figure(
            100 * _mean([num(r["kinds"][kind]["exposed_s"]) / r["step_s"] for r in present]), "%",
            f"{SOURCE}.kinds.{kind}.exposed_s / step_s")
        out[f"comm_mib.{kind}"] = Figure(_mean([num(r["kinds"][kind]["bytes"]) for r in present]) / MIB, "MiB",
                                         f"{SOURCE}.kinds.{kind}.bytes")
    if totals:
        exposed = [_sum(r["kinds"], "exposed_s") for r in ranks]
        time = [_sum(r["kinds"], "time_s") for r in ranks]
        out["comm_exposed"] = Figure(100 * _mean([e / r["step_s"] for e, r in zip(exposed, ranks, strict=True)]),
                                     "%", f"{SOURCE}: exposed_s of every kind / step_s")
        out["comm_overlap"] = Figure(100 * _mean([1 - e / t for e, t in zip(exposed, time, strict=True) if t > 0]),
                                     "%", f"{SOURCE}: 1 - exposed_s / time_s")
        out["comm_mib_per_step"] = Figure(_mean([_sum(r["kinds"], "bytes") for r in ranks]) / MIB, "MiB",
                                          f"{SOURCE}: bytes of every kind")
    return out


def collectives_by_rank(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each rank's collectives a profiled step (summary.trace.ranks.<rank>.collectives), in rank order, a
    figure not measured (stored null) as NaN; ranks whose trace showed none are left out."""
    ranks = (summary.get("trace") or {}).get("ranks") or {}
    return {r: _numbers({**ranks[r]["collectives"], "kinds": {kind: _numbers(k) for kind, k in
                                                              ranks[r]["collectives"]["kinds"].items()}})
            for r in sorted(ranks, key=int) if (ranks[r].get("collectives") or {}).get("kinds")}


def _numbers(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored mapping with its nulls read as NaN (the store writes a figure not measured as null)."""
    return {k: math.nan if v is None else v for k, v in stored.items()}


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    comm = summary.get("comm")
    if comm:  # the hook's figures, every step: the traces' window measures otherwise, so its kinds are not mixed in
        return _hooked(summary, comm)
    ranks = [r for r in collectives_by_rank(summary).values() if r["step_s"] > 0]
    if not ranks:
        return {}
    on_gpu = any(r.get("temporal") for r in ((summary.get("trace") or {}).get("ranks") or {}).values())
    return _traced(ranks, totals=not on_gpu)  # on a GPU, gpu_trace gives the totals from the kernels
