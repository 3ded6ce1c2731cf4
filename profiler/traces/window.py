"""The GPU side of one rank's trace as HTA analyzes it: which events, which kind, which times.

Events: a GPU event is one that runs on a device stream (`stream` >= 0), launched (a `correlation`
pairs it with its runtime call) or not: MTIA's `dma_request` transfers carry no correlation and HTA's
breakdowns count them. The launch statistics and the idle breakdown's host wait pair an event with
its launch, so only launched events enter them. With two `ProfilerStep`s or more HTA leaves out the
last step (`hta/common/trace.py`, the trace may end in the middle of it): host events from its start
on, launched GPU events whose launch is not kept, and the others from the step's start on.

Times (`Timing`): `exact` reads them as the trace has them, at its own resolution (ns in today's
Kineto traces; the reader keeps the digits, profiler.traces.reader). HTA reads whole microseconds
(`hta/common/trace_parser.py` `round_down_time_stamps`: a start rounded up, an end down), so each of
its events loses up to 1 us, and on a trace of short kernels its idle share doubles. `hta` reads
them as HTA does, for comparisons with HTA's own figures only. Either way an event never ends before
it starts: one shorter than HTA's rounding is empty, where HTA gives it a negative length (and can
report a negative non-compute share).

Kinds follow HTA's `get_kernel_type`: NCCL kernels are communication, Memcpy/Memset/dma memory,
kernels not matching HTA's nccl|Memcpy|Memset|Sync pattern computation, the rest other. The shares
of summary.trace use this window so that they mean what HTA's do.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from profiler.traces.reader import Trace

COMMUNICATION, MEMORY, COMPUTATION, OTHER = "communication", "memory", "computation", "other"
Timing = Literal["exact", "hta"]
EXACT: Timing = "exact"
HTA: Timing = "hta"
_NCCL = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
KERNEL_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events")
"""Categories HTA's idle-time breakdown counts as kernels."""
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync",
            "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipMemcpyAsync",
            "hipMemsetAsync", "hipMemcpyWithStream", "runFunction - job_prep_and_submit_for_execution")
"""Runtime calls the launch statistics pair with the GPU events they start: HTA's (`get_runtime_launch_events_
query`: CUDA, ROCm and MTIA's), and ROCm's hipModuleLaunchKernel, which HTA leaves out."""


def kind(name: str) -> str:
    """HTA's kernel type of a GPU event name."""
    if _NCCL.match(name):
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTATION
    return OTHER


def on_device(events: pd.DataFrame) -> np.ndarray:
    """Which events ran on the GPU: those on a device stream, whether a launch call is paired with them or not."""
    return events["stream"].to_numpy() >= 0


def times(events: pd.DataFrame, timing: Timing = EXACT) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each event in us, read as `timing` says (module docstring)."""
    ts = events["ts"].to_numpy()
    end = ts + events["dur"].to_numpy()
    if timing == HTA:
        ts, end = np.ceil(ts), np.floor(end)
    return ts, np.maximum(end, ts)


@dataclass
class Window:
    """One rank's events in HTA's window, times in us as its `Timing` reads them."""

    gpu: pd.DataFrame
    """GPU events: `name` (str), `kind`, `is_kernel` (a KERNEL_CATS category), `stream`, `correlation`
    (-1: not launched by a runtime call), `ts`, `end`, `dur`."""
    host: pd.DataFrame
    """Host events with a correlation (runtime calls): `name` (str), `correlation`, `ts`, `dur`."""


def per_code(codes: np.ndarray, of: Callable[[int], Any]) -> np.ndarray:
    """`of` each code, computed once per distinct code: an event's name's kind, say, over millions of events."""
    distinct, at = np.unique(codes, return_inverse=True)
    return np.array([of(int(code)) for code in distinct] + [None], dtype=object)[:-1][at]


def _text(values: np.ndarray) -> pd.Series:
    """Strings as an object column: pandas would copy millions of them into an Arrow string column."""
    return pd.Series(values, dtype=object, copy=False)


def hta_window(trace: Trace, timing: Timing = EXACT) -> Window:
    ev = trace.events
    ts, end = times(ev, timing)
    corr = ev["correlation"].to_numpy()
    on_gpu = on_device(ev)
    names = np.asarray(trace.names, dtype=object)
    name_codes = ev["name"].to_numpy()
    step_codes = [i for i, n in enumerate(trace.names) if "ProfilerStep" in n]
    host = ~on_gpu
    is_step = host & np.isin(name_codes, step_codes)
    if len(set(name_codes[is_step])) >= 2:
        cut = ts[is_step].max()
        host &= ts < cut
        on_gpu &= np.where(corr >= 0, np.isin(corr, corr[host]), ts < cut)
    codes = name_codes[on_gpu]
    gpu = pd.DataFrame({"name": _text(names[codes]), "stream": ev["stream"].to_numpy()[on_gpu],
                        "correlation": corr[on_gpu], "ts": ts[on_gpu], "end": end[on_gpu]})
    gpu["dur"] = gpu["end"] - gpu["ts"]
    gpu["kind"] = _text(per_code(codes, lambda code: kind(trace.names[code])))
    cats = np.asarray(trace.cats, dtype=object)[ev["cat"].to_numpy()[on_gpu]]
    gpu["is_kernel"] = np.isin(cats, KERNEL_CATS)
    linked = host & (corr >= 0)
    runtime = pd.DataFrame({"name": _text(names[name_codes[linked]]), "correlation": corr[linked],
                            "ts": ts[linked], "dur": end[linked] - ts[linked]})
    return Window(gpu=gpu, host=runtime)
