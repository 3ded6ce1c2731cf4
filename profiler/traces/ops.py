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
NO_SHAPES = "[]"
"""`input_shapes` where the trace recorded none, as of an operator without inputs."""


def _code(table: list[str], text: str) -> int:
    """`text`'s code in `table`, -1 when absent: the shapes' code with which no recorded shapes group."""
    try:
        return table.index(text)
    except ValueError:
        return -1


CHUNK = 65_536
"""Events walked per slice: Python floats of a slice at a time, not of millions of events at once."""


def _parents(ts: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """For events sorted by (thread, ts, -dur): the index of each one's innermost container, or -1."""
    parent = np.full(len(ts), -1, dtype=np.int64)
    stack: list[int] = []
    ends: list[float] = []  # the stack's ends: a list read per step costs less than numpy's element reads
    last_thread = None
    for lo in range(0, len(ts), CHUNK):
        found = [-1] * len(ts[lo:lo + CHUNK])
        for j, (t, e, th) in enumerate(zip(ts[lo:lo + CHUNK].tolist(), end[lo:lo + CHUNK].tolist(),
                                           thread[lo:lo + CHUNK].tolist(), strict=True)):
            if th != last_thread:
                stack, ends, last_thread = [], [], th
            while ends and ends[-1] <= t:
                stack.pop()
                ends.pop()
            if ends and e <= ends[-1]:
                found[j] = stack[-1]
            stack.append(lo + j)
            ends.append(e)
        parent[lo:lo + CHUNK] = found
    return parent


def _subtree_sums(values: np.ndarray, parent: np.ndarray, passes: np.ndarray) -> np.ndarray:
    """`values` plus, for each event, the sums of its children that `passes` (theirs included, and so on down),
    level by level from the deepest."""
    depth = np.zeros(len(parent), dtype=np.int64)
    up = parent.copy()
    while (has := up >= 0).any():
        depth[has] += 1
        up[has] = parent[up[has]]
    total = values.astype(np.float64, copy=True)
    for level in range(int(depth.max(initial=0)), 0, -1):
        moved = (depth == level) & passes
        np.add.at(total, parent[moved], total[moved])
    return total


def op_rows(trace: Trace, rank: int, steps: int) -> pd.DataFrame:
    """ops.parquet rows of this rank (docs/run-format.md). Columns are taken for the host events alone and
    sorted once as arrays: on a trace of millions of events a frame copied to sort would double the memory."""
    ev = trace.events
    op_codes, launch_codes = trace.codes(trace.cats, HOST_OPS), trace.codes(trace.cats, LAUNCH_CATS)
    cat = ev["cat"].to_numpy()
    at = np.flatnonzero((ev["stream"].to_numpy() < 0) & np.isin(cat, op_codes + launch_codes))
    if not np.isin(cat[at], op_codes).any():
        return pd.DataFrame()
    thread, ts, dur = (ev[c].to_numpy()[at] for c in ("thread", "ts", "dur"))
    order = np.lexsort((-dur, ts, thread))  # by thread, then start, the longer (the container) first
    at, thread, ts, dur = at[order], thread[order], ts[order], dur[order]
    is_op = np.isin(cat[at], op_codes)
    parent = _parents(ts, ts + dur, thread)
    counted = (parent >= 0) & is_op  # a launch call is the operator's own CPU time, as in key_averages
    child_time = np.bincount(parent[counted], weights=dur[counted], minlength=len(at))
    corr = ev["correlation"].to_numpy()
    on_gpu = (ev["stream"].to_numpy() >= 0) & (corr >= 0)
    device = pd.Series(ev["dur"].to_numpy()[on_gpu]).groupby(corr[on_gpu]).sum()
    launched = pd.Series(corr[at]).map(device).fillna(0.0).to_numpy(copy=True)
    launched[is_op] = 0.0
    has_parent = (~is_op) & (parent >= 0)
    self_device = np.bincount(parent[has_parent], weights=launched[has_parent], minlength=len(at))
    total_device = _subtree_sums(self_device, parent, is_op & (parent >= 0))
    ops, dur, child_time = at[is_op], dur[is_op], child_time[is_op]
    self_device, total_device = self_device[is_op], total_device[is_op]
    dims = ev["input_dims"].to_numpy()[ops]
    table = pd.DataFrame({"name": ev["name"].to_numpy()[ops], "input_shapes": np.where(dims >= 0, dims, _code(
        trace.names, NO_SHAPES)), "calls": 1, "self_cpu_s": (dur - child_time) / 1e6, "cpu_total_s": dur / 1e6,
                          "self_device_s": self_device / 1e6, "device_total_s": total_device / 1e6,
                          "flops": np.nan_to_num(ev["flops"].to_numpy()[ops], nan=0.0)})
    out = table.groupby(["name", "input_shapes"], as_index=False, sort=False).sum()  # by codes: one per string
    names = np.asarray([*trace.names, NO_SHAPES], dtype=object)  # code -1: no shapes recorded
    out["name"], out["input_shapes"] = names[out["name"].to_numpy()], names[out["input_shapes"].to_numpy()]
    return out.assign(rank=rank, self_cpu_memory_bytes=0.0, self_device_memory_bytes=0.0, steps=steps)[
        ["rank", "name", "input_shapes", "calls", "self_cpu_s", "cpu_total_s", "self_device_s", "device_total_s",
         "self_cpu_memory_bytes", "self_device_memory_bytes", "flops", "steps"]]
