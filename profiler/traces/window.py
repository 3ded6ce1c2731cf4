"""The GPU side of one rank's trace as HTA analyzes it: which events, which kind, which times.

HTA (facebookresearch/HolisticTraceAnalysis, `hta/common/trace.py`, `hta/utils/utils.py`) reads
the trace in whole microseconds (a nanosecond trace's start rounded up, its end down), and with two
`ProfilerStep`s or more it leaves out the last step: host events from its start on, and GPU events
whose launch (same `correlation`) is not kept, since the trace may end in the middle of it. A GPU
event is one with a `stream` and a `correlation`. Its kind follows HTA's `get_kernel_type`: NCCL
kernels are communication, Memcpy/Memset/dma memory, kernels not matching HTA's
nccl|Memcpy|Memset|Sync pattern computation, the rest other. The shares of summary.trace use this
window so that they mean what HTA's do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiler.traces.reader import Trace

COMMUNICATION, MEMORY, COMPUTATION, OTHER = "communication", "memory", "computation", "other"
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


@dataclass
class Window:
    """One rank's events in HTA's window, times in whole us."""

    gpu: pd.DataFrame
    """GPU events: `name` (str), `kind`, `is_kernel` (a KERNEL_CATS category), `stream`, `correlation`,
    `ts`, `end`, `dur`."""
    host: pd.DataFrame
    """Host events with a correlation (runtime calls): `name` (str), `correlation`, `ts`, `dur`."""


def rounded(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Start and end in whole us, as HTA reads them."""
    ts = events["ts"].to_numpy()
    return np.ceil(ts), np.floor(ts + events["dur"].to_numpy())


def hta_window(trace: Trace) -> Window:
    ev = trace.events
    ts, end = rounded(ev)
    on_gpu = (ev["stream"].to_numpy() >= 0) & (ev["correlation"].to_numpy() >= 0)
    names = np.asarray(trace.names, dtype=object)
    name_codes = ev["name"].to_numpy()
    step_codes = [i for i, n in enumerate(trace.names) if "ProfilerStep" in n]
    host = ~on_gpu
    is_step = host & np.isin(name_codes, step_codes)
    if len(set(name_codes[is_step])) >= 2:
        host &= ts < ts[is_step].max()
        on_gpu &= np.isin(ev["correlation"].to_numpy(), ev["correlation"].to_numpy()[host])
    gpu = pd.DataFrame({"name": names[name_codes[on_gpu]], "stream": ev["stream"].to_numpy()[on_gpu],
                        "correlation": ev["correlation"].to_numpy()[on_gpu], "ts": ts[on_gpu], "end": end[on_gpu]})
    gpu["dur"] = gpu["end"] - gpu["ts"]
    kinds = {n: kind(n) for n in gpu["name"].unique()}
    gpu["kind"] = gpu["name"].map(kinds)
    cats = np.asarray(trace.cats, dtype=object)[ev["cat"].to_numpy()[on_gpu]]
    gpu["is_kernel"] = np.isin(cats, KERNEL_CATS)
    linked = host & (ev["correlation"].to_numpy() >= 0)
    runtime = pd.DataFrame({"name": names[name_codes[linked]], "correlation": ev["correlation"].to_numpy()[linked],
                            "ts": ts[linked], "dur": end[linked] - ts[linked]})
    return Window(gpu=gpu, host=runtime)
