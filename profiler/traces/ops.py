"""Operator aggregates of one rank's trace, in profile-run's ops.parquet columns.

Host operators are the `cpu_op` and `user_annotation` events; an event's parent is the innermost
one on the same thread that contains it, so self CPU time is its duration minus its children's
(what torch.profiler's `key_averages` reports). Device time: each GPU event belongs to the runtime
call that launched it (same `correlation`), and so to the innermost operator around that call:
that operator's self device time, and every enclosing operator's total. Grouped by name and input
shapes (`Input Dims`, recorded with `record_shapes=True`). Memory is not in the events (0); `flops`
only where the trace recorded it (`with_flops=True`). `steps` is the rank's ProfilerStep count.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.traces.reader import Trace

HOST_OPS = ("cpu_op", "user_annotation")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def _parents(ts: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """For events sorted by (thread, ts, -dur): the index of each one's innermost container, or -1."""
    parent = [-1] * len(ts)
    ends = end.tolist()  # Python floats: a numpy element read per step would cost more than the loop
    stack: list[int] = []
    last_thread = None
    for i, (t, e, th) in enumerate(zip(ts.tolist(), ends, thread.tolist(), strict=True)):
        if th != last_thread:
            stack, last_thread = [], th
        while stack and ends[stack[-1]] <= t:
            stack.pop()
        if stack and e <= ends[stack[-1]]:
            parent[i] = stack[-1]
        stack.append(i)
    return np.asarray(parent, dtype=np.int64)


def op_rows(trace: Trace, rank: int, steps: int) -> pd.DataFrame:
    """ops.parquet rows of this rank (docs/run-format.md)."""
    ev = trace.events
    op_codes, launch_codes = trace.codes(trace.cats, HOST_OPS), trace.codes(trace.cats, LAUNCH_CATS)
    columns = ["cat", "name", "thread", "ts", "dur", "correlation", "input_dims", "flops"]
    host = ev.loc[(ev["stream"] < 0) & ev["cat"].isin(op_codes + launch_codes), columns]
    if not host["cat"].isin(op_codes).any():
        return pd.DataFrame()
    host["end"] = host["ts"] + host["dur"]
    host = host.sort_values(["thread", "ts", "dur"], ascending=[True, True, False], kind="stable", ignore_index=True)
    parent = _parents(host["ts"].to_numpy(), host["end"].to_numpy(), host["thread"].to_numpy())
    is_op = host["cat"].isin(op_codes).to_numpy()
    dur = host["dur"].to_numpy()
    counted = (parent >= 0) & is_op  # a launch call is the operator's own CPU time, as in key_averages
    child_time = np.bincount(parent[counted], weights=dur[counted], minlength=len(host))
    gpu = ev[(ev["stream"] >= 0) & (ev["correlation"] >= 0)]
    launched = host["correlation"].map(gpu.groupby("correlation")["dur"].sum()).fillna(0.0).to_numpy(copy=True)
    launched[is_op] = 0.0
    has_parent = (~is_op) & (parent >= 0)
    self_device = np.bincount(parent[has_parent], weights=launched[has_parent], minlength=len(host))
    total = self_device.tolist()
    up, op = parent.tolist(), is_op.tolist()
    for i in np.argsort(host["ts"].to_numpy(), kind="stable")[::-1].tolist():  # children start after parents
        if up[i] >= 0 and op[i]:
            total[up[i]] += total[i]
    total_device = np.asarray(total)
    host, dur, child_time = host[is_op], dur[is_op], child_time[is_op]
    self_device, total_device = self_device[is_op], total_device[is_op]
    names = np.asarray(trace.names, dtype=object)
    shapes = np.where(host["input_dims"].to_numpy() >= 0, names[host["input_dims"].clip(lower=0).to_numpy()], "[]")
    table = pd.DataFrame({"name": names[host["name"].to_numpy()], "input_shapes": shapes, "calls": 1,
                          "self_cpu_s": (dur - child_time) / 1e6, "cpu_total_s": dur / 1e6,
                          "self_device_s": self_device / 1e6, "device_total_s": total_device / 1e6,
                          "flops": host["flops"].fillna(0.0).to_numpy()})
    out = table.groupby(["name", "input_shapes"], as_index=False, sort=False).sum()
    return out.assign(rank=rank, self_cpu_memory_bytes=0.0, self_device_memory_bytes=0.0, steps=steps)[
        ["rank", "name", "input_shapes", "calls", "self_cpu_s", "cpu_total_s", "self_device_s", "device_total_s",
         "self_cpu_memory_bytes", "self_device_memory_bytes", "flops", "steps"]]
