"""GPU event aggregates of one rank's trace (kernels.parquet): per name, its kind (HTA's kernel
type), how many, and their time.

Columns: `rank`, `name`, `kind` (computation, communication, memory, other), `stream` (the
stream most of them ran on), `calls`, `time_s`, `mean_s`, `min_s`, `max_s`, `steps` (ProfilerSteps
of the rank: divide by it for per-step figures). Every GPU event of the trace counts (window.on_device:
launched or not, as MTIA's DMA transfers).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.traces.reader import Trace
from profiler.traces.window import kind, on_device


def kernel_rows(trace: Trace, rank: int, steps: int) -> pd.DataFrame:
    ev = trace.events
    gpu = ev[on_device(ev)]
    if gpu.empty:
        return pd.DataFrame()
    g = gpu.groupby("name")
    out = pd.DataFrame({"calls": g.size(), "time_s": g["dur"].sum() / 1e6, "mean_s": g["dur"].mean() / 1e6,
                        "min_s": g["dur"].min() / 1e6, "max_s": g["dur"].max() / 1e6,
                        "stream": g["stream"].agg(lambda s: s.mode().iloc[0])}).reset_index()
    names = np.asarray(trace.names, dtype=object)
    out["name"] = names[out["name"].to_numpy()]
    out["kind"] = out["name"].map(kind)
    return out.assign(rank=rank, steps=steps)[["rank", "name", "kind", "stream", "calls", "time_s", "mean_s",
                                               "min_s", "max_s", "steps"]]
