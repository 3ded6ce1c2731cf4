"""Existing torch.profiler chrome traces (one per rank) read once and analyzed: what `glmperf import` stores."""

from profiler.traces.reader import TraceError, read_trace
from profiler.traces.summary import ImportFailed, trace_summary

__all__ = ["ImportFailed", "TraceError", "read_trace", "trace_summary"]
