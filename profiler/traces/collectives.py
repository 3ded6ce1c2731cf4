"""Communication by collective in one rank's trace: calls, payload bytes, time and exposed time per step.

A collective is a process-group operator on the host (`c10d::allreduce_`, `c10d::_allgather_base_`,
`c10d::send`, ...; the functional collectives of tensor parallelism run one inside), its kind from
that name. Payload bytes follow `glmperf plan` (profiler.advice.plan), so the two compare: the tensor an
all-gather produces, a reduce-scatter or all-to-all consumes, an all-reduce or broadcast works on, a
send or recv moves. An operator that takes a tensor list records no shapes: its bytes are those of
the backend's own event (`gloo:all_reduce`, `nccl:all_reduce`, with the tensor it works on), matched
in order within the family (gloo runs a reduce-scatter as an all-reduce of its input: matched by size);
where that records none either, those its process group's args give (profiler.traces.comm_args: of the
`record_param_comms` of its kind inside it, else of the first kernel of its kind it launched).

Time is the backend's, the union of its events' intervals (work on two streams or threads at once
counts once). On the GPU, the NCCL kernels, each of its collective's kind: the `Collective name` its
args give (its own, or those of the `record_param_comms` its launch call was made in), else the
collective that launched it: its launch call (the kernel's `correlation`) sits inside the backend's
event (`nccl:all_reduce`) and the process-group operator. NCCL 2.19+ and RCCL name most kernels
`ncclDevKernel_Generic`, and all-to-all runs SendRecv kernels, so a kernel's name says its kind only
where neither does (`AllReduce` in it, ...; else send_recv); `kernels_by` counts the kernels each way.
On the CPU, gloo's events, each the work of the operator matched to it: on its worker threads, or on
the training thread from posting to completion (a pipeline's asynchronous sends and receives, in flight
while the thread computes). Exposed time is the part of it no computation overlaps: compute kernels on
the GPU (HTA's comm_comp_overlap, per kind), on the CPU the training threads' aten operators, so a
pipeline stage waiting for its neighbour (its bubble) shows as exposed send_recv.
"""

from __future__ import annotations

import ast
import math
import re
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

from profiler.traces import comm_args, intervals
from profiler.traces.ops import HOST_OPS
from profiler.traces.reader import Trace
from profiler.traces.window import COMMUNICATION, COMPUTATION, Window, hta_window, per_code, times
from profiler.traces.window import kind as gpu_kind

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "send_recv", "all_to_all")
OPS: dict[str, tuple[str, str, int]] = {
    # operator -> (kind, backend family, the argument holding the payload; -1: a tensor list, ask the backend)
    "c10d::_allgather_base_": ("all_gather", "all_gather", 0),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", "all_gather", 0),
    "c10d::allgather_": ("all_gather", "all_gather", -1),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", "reduce_scatter", 1),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", "reduce_scatter", 1),
    "c10d::reduce_scatter_": ("reduce_scatter", "reduce_scatter", -1),
    "c10d::allreduce_": ("all_reduce", "all_reduce", -1),
    "c10d::allreduce_coalesced_": ("all_reduce", "all_reduce", -1),
    "c10d::broadcast_": ("broadcast", "broadcast", -1),
    "c10d::send": ("send_recv", "send", -1),
    "c10d::recv_": ("send_recv", "recv", -1),
    "c10d::recv_any_source_": ("send_recv", "recv", -1),
    "c10d::alltoall_base_": ("all_to_all", "all_to_all", 1),
    "c10d::alltoall_": ("all_to_all", "all_to_all", -1),
}
_BACKEND = re.compile(r"^(gloo|nccl):_?(all_?gather|reduce_scatter|all_?reduce|broadcast|send|recv|all_to_all)")
_FAMILY = {"allgather": "all_gather", "allreduce": "all_reduce"}
_KERNEL_KIND = (("AllGather", "all_gather"), ("ReduceScatter", "reduce_scatter"), ("AllReduce", "all_reduce"),
                ("Broadcast", "broadcast"), ("SendRecv", "send_recv"), ("Send", "send_recv"), ("Recv", "send_recv"),
                ("AllToAll", "all_to_all"))
WAITING = re.compile(r"^(c10d::|_c10d_functional::|c10d_functional::|record_param_comms)")
"""Host events inside which a training thread waits on communication, even within an aten operator
(a DTensor operator all-reduces and waits inside its own span): not computation."""
ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
            "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}
"""Bytes per element of the dtypes the profiler names in `Input type`."""


def _parse(text: str | None) -> list[Any]:
    try:
        value = ast.literal_eval(text) if text else []
    except (ValueError, SyntaxError):
        return []
    return value if isinstance(value, list) else []


def _bytes(dims: list[Any], types: list[Any], arg: int) -> float:
    """Bytes of argument `arg` when it is one tensor of a known dtype, else NaN."""
    if not 0 <= arg < min(len(dims), len(types)) or types[arg] not in ITEMSIZE:
        return math.nan
    shape = dims[arg]
    if not isinstance(shape, list) or any(not isinstance(d, int) for d in shape):
        return math.nan
    return float(np.prod(shape, dtype=np.float64) * ITEMSIZE[types[arg]])


def _list_numel(dims: list[Any], types: list[Any], arg: int) -> float:
    """Elements of argument `arg` when it is a tensor list (its dtype is not recorded), else NaN."""
    if not 0 <= arg < min(len(dims), len(types)) or types[arg] != "TensorList":
        return math.nan
    shapes = dims[arg]
    if not isinstance(shapes, list) or not all(isinstance(s, list) and all(isinstance(d, int) for d in s)
                                               for s in shapes):
        return math.nan
    return float(sum(np.prod(shape, dtype=np.float64) for shape in shapes))


FUNCTIONAL = "_c10d_functional::"
"""DTensor's collectives: the operator that encloses a coalesced c10d operator and names its dtype."""


def _enclosing(outer: pd.DataFrame, thread: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """For each point (a thread, a time), the position in `outer` (host events in time order, not nested
    in one another) of the event on that thread around it, or -1."""
    found = np.full(len(ts), -1, dtype=np.int64)
    threads = outer["thread"].to_numpy()
    for key in np.unique(threads):
        positions = np.flatnonzero(threads == key)
        starts = outer["ts"].to_numpy()[positions]
        ends = starts + outer["dur"].to_numpy()[positions]
        mine = np.flatnonzero(thread == key)
        at = np.searchsorted(starts, ts[mine], side="right") - 1
        inside = (at >= 0) & (ts[mine] <= ends[np.maximum(at, 0)])
        found[mine[inside]] = positions[at[inside]]
    return found


def _enclosing_itemsize(host: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Bytes per element of each operator's enclosing functional collective (its first argument), or NaN."""
    outer = host[(host["role"] == WAIT) & host["name"].str.startswith(FUNCTIONAL, na=False)]
    items = np.array([ITEMSIZE.get((_parse(t) or [None])[0], np.nan) for t in outer["types"]] + [np.nan])
    return items[_enclosing(outer, ops["thread"].to_numpy(), ops["ts"].to_numpy())]


OTHER, OP, BACKEND, WAIT, ATEN, STEP = range(6)
"""What a host event is to this analysis, from its name."""


def _role(name: str) -> int:
    if name in OPS:
        return OP
    if _BACKEND.match(name):
        return BACKEND
    if WAITING.match(name):
        return WAIT
    return ATEN if name.startswith("aten::") else STEP if name.startswith("ProfilerStep#") else OTHER


def _host(trace: Trace) -> pd.DataFrame:
    """The host events this analysis reads, by `role`, in time order; the names, shapes and dtypes only of
    the collective operators and backend events (classified by name code: a trace has millions of events
    and a few thousand names)."""
    ev = trace.events
    roles = np.array([_role(n) for n in trace.names] + [OTHER], dtype=np.int8)  # code -1: the last
    role = roles[ev["name"].to_numpy()]
    keep = (ev["stream"].to_numpy() < 0) & ev["cat"].isin(trace.codes(trace.cats, HOST_OPS)).to_numpy() & (role > 0)
    at = np.flatnonzero(keep)  # then in time order: columns taken once, no frame copied to sort
    at = at[np.argsort(ev["ts"].to_numpy()[at], kind="stable")]
    out = pd.DataFrame({"role": role[at], **{c: ev[c].to_numpy()[at] for c in ("thread", "ts", "dur")}})
    named = np.isin(out["role"].to_numpy(), (OP, BACKEND, WAIT))
    lookup = np.array([*trace.names, None], dtype=object)
    for column, source in (("name", "name"), ("dims", "input_dims"), ("types", "input_types")):
        values = np.full(len(out), None, dtype=object)
        values[named] = lookup[ev[source].to_numpy()[at[named]]]
        out[column] = values
    return out


def _match(ops: pd.DataFrame, backend: pd.DataFrame, lookahead: int = 64) -> list[int]:
    """For each operator (in time order), the index of its backend event in `backend`, or -1: the first
    unused one of its family that starts after it (an event that starts before an operator can belong to
    no later one either), or for a reduce-scatter the first all-reduce of its size within `lookahead`."""
    queues: dict[str, list[int]] = defaultdict(list)
    for i, family in enumerate(backend["family"]):
        queues[family].append(i)
    heads: dict[str, int] = defaultdict(int)
    used = np.zeros(len(backend), dtype=bool)
    ts, size = backend["ts"].to_numpy(), backend["bytes"].to_numpy()
    matched = []
    for op_ts, family, op_bytes in zip(ops["ts"], ops["family"], ops["bytes"], strict=True):
        found = -1
        for queue, want in [(family, None)] + ([("all_reduce", op_bytes)] if family == "reduce_scatter" else []):
            events = queues.get(queue, [])
            while heads[queue] < len(events) and (used[events[heads[queue]]] or ts[events[heads[queue]]] < op_ts):
                heads[queue] += 1
            window = events[heads[queue]:heads[queue] + (1 if want is None else lookahead)]
            found = next((i for i in window if not used[i] and (want is None or size[i] == want)), -1)
            if found >= 0:
                used[found] = True
                break
        matched.append(found)
    return matched


def _spans(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return intervals.merge(events["ts"].to_numpy(), (events["ts"] + events["dur"]).to_numpy())


def _exposed(starts: np.ndarray, ends: np.ndarray, busy: tuple[np.ndarray, np.ndarray]) -> float:
    """Time in the union of [starts, ends) that `busy` (merged intervals) does not cover."""
    union = intervals.merge(starts, ends)
    return intervals.length(*union) - intervals.overlap(union, busy)


def _launch_calls(trace: Trace) -> pd.DataFrame:
    """Each launch call once (the host's first event of each correlation): `thread`, `ts`, `correlation`.
    Taken once per trace and shared: every reader of launches would otherwise filter all its events again."""
    ev = trace.events
    corr = ev["correlation"].to_numpy()
    at = np.flatnonzero((ev["stream"].to_numpy() < 0) & (corr >= 0))
    calls = pd.DataFrame({c: ev[c].to_numpy()[at] for c in ("thread", "ts", "correlation")})
    return calls.drop_duplicates("correlation", ignore_index=True)


def _launched_in(calls: pd.DataFrame, *outers: tuple[pd.DataFrame, pd.Series]) -> pd.Series:
    """What each launch call of `calls` (_launch_calls; index: its correlation) was made in: the value of the
    event of `outers` around it (host events in time order, with a value each: their kind, their position),
    a later one of `outers` winning."""
    if not any(len(events) for events, _ in outers):
        return pd.Series(dtype=object)
    thread, ts = calls["thread"].to_numpy(), calls["ts"].to_numpy()
    kinds = np.full(len(calls), None, dtype=object)
    for events, kind in outers:
        at = _enclosing(events, thread, ts)
        kinds[at >= 0] = kind.to_numpy()[at[at >= 0]]
    found = pd.notna(kinds)
    return pd.Series(kinds[found], index=calls["correlation"].to_numpy()[found], dtype=object)


def _kind_by_name(name: str) -> str:
    return next((kind for key, kind in _KERNEL_KIND if key in name), "send_recv")


def _arg_events(trace: Trace, calls: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The collective events' args (comm_args.described): the host's of a known kind (`record_param_comms`,
    with `thread`, `ts`, `dur`, in time order; not a work's `wait`, whose group size is 1), and each launch's
    (index: its correlation): the kernel's own, else those of the host's event its launch call was made in."""
    args = comm_args.described(trace.comms)
    ev = trace.events.iloc[args["row"].to_numpy()]
    on_gpu = ev["stream"].to_numpy() >= 0
    known = ~on_gpu & args["kind"].notna().to_numpy()
    host = args[known].assign(**{c: ev[c].to_numpy()[known] for c in ("thread", "ts", "dur")})
    host = host.sort_values("ts", kind="stable", ignore_index=True)
    corr = ev["correlation"].to_numpy()
    own = args[on_gpu & (corr >= 0)].set_axis(corr[on_gpu & (corr >= 0)])
    inside = _launched_in(calls, (host, pd.Series(np.arange(len(host)))))
    inherited = host[list(args)].iloc[inside.to_numpy(dtype=np.int64)].set_axis(inside.index)
    launches = pd.concat([own, inherited[~inherited.index.isin(own.index)]]) if len(inherited) else own
    return host, launches[~launches.index.duplicated()]


def _arg_bytes(ops: pd.DataFrame, host: pd.DataFrame, launches: pd.DataFrame, op_at: pd.Series) -> np.ndarray:
    """Each operator's bytes as its process group's args give them (module docstring), NaN where none do."""
    at = np.concatenate([_enclosing(ops, host["thread"].to_numpy(), host["ts"].to_numpy()),
                         op_at.reindex(launches.index).fillna(-1).to_numpy(dtype=np.int64)])
    kinds = np.concatenate([host["kind"].to_numpy(), launches["kind"].to_numpy()])
    nbytes = np.concatenate([host["bytes"].to_numpy(), launches["bytes"].to_numpy()])
    mine = at >= 0
    mine[mine] = kinds[mine] == ops["kind"].to_numpy()[at[mine]]
    first = pd.Series(nbytes[mine]).groupby(at[mine]).first()  # the host's event before any kernel's
    out = np.full(len(ops), np.nan)
    out[first.index.to_numpy(dtype=np.int64)] = first.to_numpy()
    return out


def _gpu_times(window: Window, launched: pd.Series, named: pd.Series
               ) -> tuple[dict[str, tuple[float, float]], dict[str, int]]:
    """(time, exposed) in us by kind, from the NCCL kernels of the trace (HTA's window), each of the kind its
    args name (`named`, by correlation), else the one its launch was made in (`launched`), else its name's;
    and how many kernels got their kind each way."""
    gpu = window.gpu
    comm = gpu[gpu["kind"] == COMMUNICATION]
    comp = gpu[gpu["kind"] == COMPUTATION]
    busy = intervals.merge(comp["ts"].to_numpy(), comp["end"].to_numpy())
    by_args = comm["correlation"].map(named).astype(object)  # NaN, a float, where none is named
    by_host = comm["correlation"].map(launched).astype(object).where(by_args.isna())
    kinds = by_args.fillna(by_host).fillna(comm["name"].map(_kind_by_name))
    out = {}
    for kind, part in comm.groupby(kinds):
        s, e = part["ts"].to_numpy(), part["end"].to_numpy()
        out[str(kind)] = (intervals.length(*intervals.merge(s, e)), _exposed(s, e, busy))
    return out, {"collective_name": int(by_args.notna().sum()), "host_operator": int(by_host.notna().sum()),
                 "kernel_name": int((by_args.isna() & by_host.isna()).sum())}


GROUP = {"group": "", "group_desc": None, "group_ranks": None, "group_size": -1}
"""A call's process group (comm_args.described) and what stands for it where its args give none."""
CALLS = ["kind", "launch_us", "start_us", "dur_us", "bytes", *GROUP]
"""Columns of `kernel_calls`."""


def _kernel_calls(trace: Trace, calls: pd.DataFrame, launched: pd.Series, op_at: pd.Series, op_bytes: np.ndarray,
                  launches: pd.DataFrame) -> pd.DataFrame:
    """Each NCCL kernel of the whole trace (not HTA's window: profiler.traces.collective_skew matches the
    ranks' calls one by one, and an incomplete last step's find no partner): its kind (as `_gpu_times`
    gives it), its launch's time, its start and duration (us, the trace's `ts`), payload bytes, those of
    the operator whose launch it is (`op_at`: its position in `op_bytes`) split among its kernels, else its
    args' (`launches`, by correlation), and its process group as its args name it (GROUP)."""
    ev = trace.events
    comm = np.array([gpu_kind(n) == COMMUNICATION for n in trace.names] + [False])
    gpu = ev[(ev["stream"].to_numpy() >= 0) & comm[ev["name"].to_numpy()] & (ev["correlation"].to_numpy() >= 0)]
    if gpu.empty:
        return pd.DataFrame(columns=CALLS)
    corr = gpu["correlation"]
    start, end = times(gpu)
    op = corr.map(op_at).astype(float).fillna(-1).astype(np.int64)
    kernels_of_op = op.map(op.value_counts()).to_numpy()
    by_name = pd.Series(per_code(gpu["name"].to_numpy(), lambda code: _kind_by_name(trace.names[code])),
                        index=gpu.index)
    return pd.DataFrame({
        "kind": corr.map(launches["kind"]).astype(object).fillna(corr.map(launched)).fillna(by_name).to_numpy(),
        "launch_us": corr.map(calls.set_index("correlation")["ts"]).to_numpy(dtype=float),
        "start_us": start, "dur_us": end - start,
        "bytes": np.where(op.to_numpy() >= 0, np.append(op_bytes, math.nan)[op.to_numpy()] / kernels_of_op,
                          corr.map(launches["bytes"]).to_numpy(dtype=float)),
        **{c: corr.map(launches[c]).astype(object).fillna(empty).replace({math.nan: None}).to_numpy()
           for c, empty in GROUP.items()}})


def _operators(host: pd.DataFrame) -> pd.DataFrame:
    """The process-group operators of `host` with their `kind`, backend `family` and payload `bytes` (NaN
    where the operator does not say: its backend event may)."""
    ops = host[host["role"] == OP].copy()
    ops["kind"], ops["family"], arg = zip(*ops["name"].map(OPS), strict=True)
    ops["bytes"] = [_bytes(_parse(d), _parse(t), a) for d, t, a in zip(ops["dims"], ops["types"], arg, strict=True)]
    # a coalesced operator (DTensor's) records its tensors' shapes but not their dtype: the enclosing one has it
    numel = np.array([_list_numel(_parse(d), _parse(t), a) for d, t, a in zip(ops["dims"], ops["types"], arg,
                                                                                strict=True)])
    listed = np.isfinite(numel)
    if listed.any():
        ops.loc[listed, "bytes"] = numel[listed] * _enclosing_itemsize(host, ops[listed])
    return ops


def _backend(host: pd.DataFrame) -> pd.DataFrame:
    """The backend's events of `host` with their `library` (gloo, nccl), `family`, `kind` and `bytes`."""
    backend = host[host["role"] == BACKEND].copy()
    found = backend["name"].str.extract(_BACKEND)
    backend["library"] = found[0]
    backend["family"] = found[1].map(lambda f: _FAMILY.get(f, f))
    backend["kind"] = backend["family"].replace({"send": "send_recv", "recv": "send_recv"})
    backend["bytes"] = [_bytes(_parse(d), _parse(t), 0) for d, t in zip(backend["dims"], backend["types"], strict=True)]
    return backend


def analyze(trace: Trace, steps: int, window: Window | None = None) -> dict[str, Any]:
    """{"backend", "step_s", "kinds": {kind: {calls, bytes, time_s, exposed_s}}}, per profiled step, with NCCL
    `kernels_by` (module docstring), or {}; `window` is the trace's HTA window when the caller has it already."""
    return analyze_calls(trace, steps, window)[0]


def analyze_calls(trace: Trace, steps: int, window: Window | None = None) -> tuple[dict[str, Any], pd.DataFrame]:
    """`analyze`'s figures, and each NCCL kernel with its kind, times and bytes (`_kernel_calls`; none off NCCL)."""
    calls = pd.DataFrame(columns=CALLS)
    if steps < 1 or not set(OPS) & set(trace.names):
        return {}, calls
    host = _host(trace)
    if not (host["role"] == OP).any():  # the names occur, but not on host operators
        return {}, calls
    ops, backend = _operators(host), _backend(host)
    matched = np.asarray(_match(ops, backend), dtype=np.int64)
    has = matched >= 0
    from_backend = ops["bytes"].isna().to_numpy() & has
    ops.loc[from_backend, "bytes"] = backend["bytes"].to_numpy()[matched[from_backend]]
    name = backend["library"].iloc[0] if len(backend) else ("nccl" if (trace.events["stream"] >= 0).any() else "")
    launch_table = _launch_calls(trace)
    arg_host, launches = _arg_events(trace, launch_table)
    from_args = ops["bytes"].isna().to_numpy() & (len(trace.comms) > 0)
    op_at = _launched_in(launch_table, (ops, pd.Series(np.arange(len(ops)), index=ops.index))) \
        if name == "nccl" or from_args.any() else pd.Series(dtype=object)
    if from_args.any():
        ops.loc[from_args, "bytes"] = _arg_bytes(ops, arg_host, launches, op_at)[from_args]
    out: dict[str, Any] = {"backend": name}
    kinds: dict[str, dict[str, float]] = {}
    gpu: dict[str, tuple[float, float]] = {}
    if name == "nccl":  # the operator's kind wins over its backend event's (gloo runs a reduce-scatter as all-reduce)
        launched = _launched_in(launch_table, (backend, backend["kind"]), (ops, ops["kind"]))
        gpu, out["kernels_by"] = _gpu_times(window or hta_window(trace), launched, launches["kind"].dropna())
        calls = _kernel_calls(trace, launch_table, launched, op_at, ops["bytes"].to_numpy(dtype=float), launches)
    for kind in set(gpu) - set(ops["kind"]):  # kernels of operators outside the window, or named by no operator
        kinds[kind] = {"calls": math.nan, "bytes": math.nan, "time_s": gpu[kind][0] / 1e6 / steps,
                       "exposed_s": gpu[kind][1] / 1e6 / steps}
    # the backend's own threads (gloo's workers) compute nothing; a training thread may hold backend events
    # too (a pipeline's asynchronous sends and receives, from posting to completion) and still computes
    workers = set(backend["thread"]) - set(host.loc[host["role"] == ATEN, "thread"])
    training = host[~host["thread"].isin(workers)]
    busy = intervals.difference(_spans(training[training["role"] == ATEN]),
                                _spans(training[training["role"].isin((OP, WAIT))]))
    for key, part in ops.groupby("kind", sort=False):
        kind = str(key)  # one of OPS's kinds
        if name == "nccl":
            time_us, exposed_us = gpu.get(kind, (math.nan, math.nan))
        else:
            own = backend.iloc[matched[(ops["kind"] == kind).to_numpy() & has]]
            s, e = own["ts"].to_numpy(), (own["ts"] + own["dur"]).to_numpy()
            time_us = intervals.length(*intervals.merge(s, e)) if len(own) else math.nan
            exposed_us = _exposed(s, e, busy) if len(own) else math.nan
        kinds[kind] = {"calls": len(part) / steps, "bytes": float(part["bytes"].sum(min_count=1)) / steps,
                       "time_s": time_us / 1e6 / steps, "exposed_s": exposed_us / 1e6 / steps}
    step_us = host.loc[host["role"] == STEP, "dur"]
    return {**out, "step_s": float(step_us.mean()) / 1e6 if len(step_us) else math.nan,
            "kinds": {k: kinds[k] for k in KINDS if k in kinds}}, calls
