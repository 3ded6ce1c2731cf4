"""Reading existing torch.profiler chrome traces (one per rank) into a run: `glmperf import`."""

from profiler.traces.importer import Imported, ImportFailed, import_traces, trace_summary
from profiler.traces.reader import TraceError, read_trace

__all__ = ["ImportFailed", "Imported", "TraceError", "import_traces", "read_trace", "trace_summary"]
