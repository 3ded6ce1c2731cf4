"""Steps of one rank's trace: each `ProfilerStep#N` span a steps.parquet row, with the phases the
trace tells apart.

The step is the span torch.profiler's `ProfilerStep#N` annotation covers on the host (`step_s`,
as profile-run's steps on CPU). Inside it, on the host timeline:
- `data_s`: `enumerate(DataLoader)#...` annotations (waiting for the next batch);
- `optimizer_s`: `Optimizer.step#...` and `Optimizer.zero_grad#...` annotations;
- `backward_s`: autograd's `autograd::engine::evaluate_function: ...` operators (in a PyTorch 1.8-1.9
  trace, which has no such wrapper, the `...Backward` nodes and `AccumulateGrad`), the rest left out;
- `forward_s`: operators on the step's thread before the first backward operator, the rest left out;
- `comm_s`: communication kernels launched in the step that no computation kernel overlaps on the
  GPU (exposed), carved out of the phase that launched them (forward or backward) and capped at it,
  as profile-run's step timer carves DDP's exposed all-reduce out of backward;
- `other_s`: the remainder. `h2d_s` and `checkpoint_s` are 0: a trace does not mark them.
Phases are disjoint, so they sum to `step_s`. Tokens and loss are not in a trace (NaN). The
vocabulary's phases (profiler.metrics) are named here, not imported: that module loads torch,
which reading a trace does not need.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profiler.traces import intervals
from profiler.traces.reader import Trace
from profiler.traces.window import COMMUNICATION, COMPUTATION, kind, per_code, times

STEP = re.compile(r"^ProfilerStep#(\d+)$")
DATA = "enumerate(DataLoader)"
OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#")
BACKWARD = "autograd::engine::evaluate_function"
OLD_BACKWARD = re.compile(r"Backward\d*$|^torch::autograd::AccumulateGrad$")
"""Autograd's nodes themselves, where no `evaluate_function` wraps them (PyTorch 1.8-1.9 traces)."""
HOST_OPS = ("cpu_op", "user_annotation")


def _spans(ev: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ts = ev["ts"].to_numpy()[mask]
    return intervals.merge(ts, ts + ev["dur"].to_numpy()[mask])


def _inside(spans: tuple[np.ndarray, np.ndarray], lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    return intervals.clip(spans[0], spans[1], lo, hi)


def _minus(a: tuple[np.ndarray, np.ndarray], *others: tuple[np.ndarray, np.ndarray]) -> float:
    """Time in `a` (merged) not covered by any of `others` (merged)."""
    total = float((a[1] - a[0]).sum())
    if not len(a[0]):
        return 0.0
    rest = [o for o in others if len(o[0])]
    if not rest:
        return total
    cover = intervals.merge(np.concatenate([o[0] for o in rest]), np.concatenate([o[1] for o in rest]))
    return total - intervals.overlap(a, cover)


def step_rows(trace: Trace, rank: int) -> pd.DataFrame:
    """One row per ProfilerStep span (columns: steps.parquet's, see docs/run-format.md)."""
    ev = trace.events
    names = pd.Series(trace.names, dtype=object)  # matched once per distinct name, then looked up by code
    codes = ev["name"].to_numpy()
    cats = ev["cat"].to_numpy()
    host = ev["stream"].to_numpy() < 0
    step_of_name = pd.to_numeric(names.str.extract(STEP, expand=False)).to_numpy()
    step_no = step_of_name[codes]
    is_step = host & np.isin(cats, trace.codes(trace.cats, HOST_OPS)) & ~np.isnan(step_no)  # cpu_op: PyTorch 1.8
    if not is_step.any():
        return pd.DataFrame()

    def named(prefix: str | tuple[str, ...]) -> np.ndarray:
        return host & names.str.startswith(prefix).to_numpy()[codes]

    data, optimizer = _spans(ev, named(DATA)), _spans(ev, named(OPTIMIZER))
    wrapped = named(BACKWARD)
    backward = _spans(ev, wrapped if wrapped.any() else
                      host & names.str.contains(OLD_BACKWARD).to_numpy()[codes])
    ts, dur, thread = ev["ts"].to_numpy(), ev["dur"].to_numpy(), ev["thread"].to_numpy()
    ops = _Ops(ts, dur, thread, host & np.isin(cats, trace.codes(trace.cats, HOST_OPS)) & ~is_step)
    comm_spans = _Launched(_gpu_by_launch(trace))
    rows = []
    for i in np.flatnonzero(is_step):
        lo, hi = ts[i], ts[i] + dur[i]
        d, o = _inside(data, lo, hi), _inside(optimizer, lo, hi)
        b = _inside(backward, lo, hi)
        first_backward = b[0][0] if len(b[0]) else hi
        f = intervals.clip(*ops.on_thread(thread[i], lo, first_backward), lo, first_backward)
        data_s, optimizer_s = _minus(d), _minus(o, d)
        backward_s, forward_s = _minus(b, d, o), _minus(f, d, o)
        in_forward = min(comm_spans.exposed(lo, first_backward), forward_s)
        in_backward = min(comm_spans.exposed(first_backward, hi), backward_s)
        comm_s = in_forward + in_backward
        row = {"step": int(step_no[i]), "rank": rank, "ts_end": (hi + trace.base_us) / 1e6, "step_s": dur[i] / 1e6,
               "host_s": dur[i] / 1e6, "data_s": data_s / 1e6, "h2d_s": 0.0,
               "forward_s": (forward_s - in_forward) / 1e6, "backward_s": (backward_s - in_backward) / 1e6,
               "optimizer_s": optimizer_s / 1e6, "comm_s": comm_s / 1e6, "checkpoint_s": 0.0}
        phases = ("data_s", "h2d_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "checkpoint_s")
        row["other_s"] = max(0.0, row["step_s"] - sum(row[c] for c in phases))
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.assign(tokens=np.nan, loss=np.nan, skipped=False, warmup=False, profiled=False)


def _gpu_by_launch(trace: Trace) -> pd.DataFrame:
    """Communication and computation GPU events with the host time of their launch call."""
    ev = trace.events
    gpu = ev[(ev["stream"] >= 0) & (ev["correlation"] >= 0)]
    launch = ev[(ev["stream"] < 0) & (ev["correlation"] >= 0)].drop_duplicates("correlation")
    if gpu.empty:
        return pd.DataFrame(columns=["kind", "launch", "ts", "end"])
    start, end = times(gpu)
    out = pd.DataFrame({"kind": per_code(gpu["name"].to_numpy(), lambda code: kind(trace.names[code])),
                        "ts": start, "end": end,
                        "launch": gpu["correlation"].map(launch.set_index("correlation")["ts"]).to_numpy()})
    return out[out["kind"].isin((COMMUNICATION, COMPUTATION)) & out["launch"].notna()]


class _Ops:
    """Host operators sorted by start, for the ones of a thread that overlap a window: a slice found by binary
    search per step, where a mask over every event per step cost a pass over millions of them each."""

    def __init__(self, ts: np.ndarray, dur: np.ndarray, thread: np.ndarray, mask: np.ndarray) -> None:
        at = np.flatnonzero(mask)
        at = at[np.argsort(ts[at], kind="stable")]
        self.ts, self.end, self.thread = ts[at], ts[at] + dur[at], thread[at]
        self.reach = float((self.end - self.ts).max(initial=0.0)) + 1.0
        """The longest operator, and a microsecond for rounding: none starting earlier than a window's start less
        this overlaps it."""

    def on_thread(self, thread: int, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """The merged spans of `thread`'s operators that start before `hi` and end after `lo`."""
        part = slice(np.searchsorted(self.ts, lo - self.reach), np.searchsorted(self.ts, hi))
        keep = (self.thread[part] == thread) & (self.end[part] > lo)
        return intervals.merge(self.ts[part][keep], self.end[part][keep])


class _Launched:
    """_gpu_by_launch's kernels sorted by launch time, as arrays: a step's are a slice."""

    def __init__(self, gpu: pd.DataFrame) -> None:
        gpu = gpu.sort_values("launch", kind="stable")
        self.launch, self.kind = gpu["launch"].to_numpy(dtype=float), gpu["kind"].to_numpy()
        self.ts, self.end = gpu["ts"].to_numpy(dtype=float), gpu["end"].to_numpy(dtype=float)

    def exposed(self, lo: float, hi: float) -> float:
        """Communication time of the kernels launched in [lo, hi) that no computation kernel overlaps (us)."""
        part = slice(np.searchsorted(self.launch, lo), np.searchsorted(self.launch, hi))
        kind, ts, end = self.kind[part], self.ts[part], self.end[part]
        comm = kind == COMMUNICATION
        if not comm.any():
            return 0.0
        comp = kind == COMPUTATION
        comm_u = intervals.merge(ts[comm], end[comm])
        comp_u = intervals.merge(ts[comp], end[comp])
        return float((comm_u[1] - comm_u[0]).sum()) - intervals.overlap(comm_u, comp_u)
