"""Instruments: trainer hooks that measure a run (one file each, a tiny shared base)."""

from profiler.instruments.base import Instrument
from profiler.instruments.comm import CommStats
from profiler.instruments.nvml import NvmlBackend, ReplayBackend, nvml_row, nvml_status
from profiler.instruments.samplers import Backend, CpuBackend, Sampler, choose_backend
from profiler.instruments.step_timer import STEP_COLUMNS, StepTimer
from profiler.instruments.torch_profiler import TraceWindow

__all__ = [
    "STEP_COLUMNS", "Backend", "CommStats", "CpuBackend", "Instrument", "NvmlBackend", "ReplayBackend", "Sampler",
    "StepTimer", "TraceWindow", "choose_backend", "nvml_row", "nvml_status",
]
