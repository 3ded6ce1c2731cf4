"""Distributed data parallel: DDP, gradient-compression comm hooks, and their counters (000 2.4;
004 2.2, 2.4, 4.1).

Under torchrun (world size > 1) the model is wrapped in DistributedDataParallel, which packs
gradients into buckets and all-reduces each bucket as soon as backward has produced it, so the
communication overlaps the rest of backward. The source's loop of one blocking `dist.all_reduce`
per parameter after backward (000 2.4) is the opposite: as many collectives as parameters, none
overlapped. The comm hook chooses what a bucket sends: fp32 (none), fp16/bf16 (half the bytes),
or PowerSGD's rank-r factors. torch's own hooks run inside a thin recording hook that fills
`CommStats`, which the profiler reads once per step.

Bytes are the payload each all-reduce is handed: the bucket's elements x 4 (fp32), x 2 (fp16,
bf16); for PowerSGD the elements after compression that `PowerSGDState.compression_stats()`
counts for the bucket (the P and Q factors plus the tensors it leaves uncompressed: biases,
norms, matrices too small to gain), or the whole bucket in its first plain all-reduce steps. A
ring all-reduce puts 2(N-1)/N times the payload on each rank's wire (the bus-bandwidth factor).

Exposed communication is approximated as the latest completion of any bucket minus the latest
launch: DDP launches the last bucket when backward has produced its last gradient, so no backward
compute is left to hide what runs after that. It includes the hook's own work on that bucket
(casts, PowerSGD's matmuls), which nothing overlaps either.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import ConfigError, DdpConfig, SwitchesConfig

TIMEOUT_ENV = "GLMPERF_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
_WIRE_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}


def local_rank() -> int:
    """This process's GPU index on its node, from torchrun's environment."""
    return int(os.environ.get("LOCAL_RANK", 0))


def resolve_backend(cfg: DdpConfig, device: torch.device) -> str:
    """auto: NCCL for CUDA tensors, gloo for CPU tensors."""
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"


def dist_timeout_s() -> float:
    """Seconds a collective may wait for a peer before the group fails ($GLMPERF_DIST_TIMEOUT_S).

    A backstop: when a rank dies, torchrun's agent normally ends the others at once.
    """
    raw = os.environ.get(TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(TIMEOUT_ENV, f"got {raw!r}; allowed: seconds > 0")
    return value


@functools.cache
def gloo_all_reduces(dtype: torch.dtype) -> bool:
    """Whether this torch's gloo all-reduces `dtype` (bf16 came late: pytorch#111131).

    A private one-rank gloo group runs the same dtype dispatch as a real one ("Invalid scalar
    type" when missing) in milliseconds, without touching the default process group.
    """
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=10))
    try:
        group.allreduce([torch.zeros(2, dtype=dtype)]).wait()
    except RuntimeError:
        return False
    return True


def init_process_group(cfg: DdpConfig, ctx: SetupContext) -> str:
    """Join torchrun's group (env://) unless the caller already has; returns the backend."""
    if dist.is_initialized():
        return dist.get_backend()
    backend = resolve_backend(cfg, ctx.device)
    dist.init_process_group(backend, timeout=timedelta(seconds=dist_timeout_s()))
    return backend


# --------------------------------------------------------------------------------------------
# Counting and timing every bucket's all-reduce


@dataclass
class _Bucket:
    calls: int
    nbytes: int
    launch: Any
    """Host seconds (perf_counter) or, on CUDA, an event recorded at launch."""
    done: Any = None


def _busy_time(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [launch, done] spans: time with at least one all-reduce in flight."""
    total, end = 0.0, -math.inf
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


class StepComm(Mapping[str, float]):
    """One step's all-reduce figures, computed when first read.

    calls: collectives issued (1 per bucket; PowerSGD 3: uncompressed tensors, P, Q);
    buckets: DDP buckets reduced; bytes: payload handed to all_reduce (module docstring);
    time_s: wall time with at least one bucket in flight, launch to completion, hook work included;
    exposed_s: the part after the last launch, which backward does not overlap;
    bandwidth: bytes / time_s in bytes/s (algorithm bandwidth).

    On CUDA the spans are events: reading before the step's device work is done waits for it, so a
    caller that reads lazily (after its own end-of-step event) never stalls the host.
    """

    def __init__(self, buckets: list[_Bucket], *, cuda: bool) -> None:
        self._buckets, self._cuda = buckets, cuda
        self._values: dict[str, float] | None = None

    def _spans(self, buckets: list[_Bucket]) -> list[tuple[float, float]]:
        if not self._cuda:
            return [(b.launch, b.done) for b in buckets]
        for b in buckets:
            b.launch.synchronize()
            b.done.synchronize()
        origin = buckets[0].launch
        return [(origin.elapsed_time(b.launch) / 1e3, origin.elapsed_time(b.done) / 1e3) for b in buckets]

    def _resolve(self) -> dict[str, float]:
        if self._values is None:
            finished = [b for b in self._buckets if b.done is not None]
            spans = self._spans(finished) if finished else []
            busy = _busy_time(spans)
            exposed = max(0.0, max(d for _, d in spans) - max(s for s, _ in spans)) if spans else 0.0
            nbytes = sum(b.nbytes for b in self._buckets)
            self._values = {"calls": sum(b.calls for b in self._buckets), "buckets": len(self._buckets),
                            "bytes": nbytes, "time_s": busy, "exposed_s": exposed,
                            "bandwidth": nbytes / busy if busy > 0 else 0.0}
            self._buckets = []
        return self._values

    def __getitem__(self, key: str) -> float:
        return self._resolve()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._resolve())

    def __len__(self) -> int:
        return len(self._resolve())


class CommStats:
    """The gradient all-reduces of the current step, filled by the recording comm hook.

    `take_step()` hands over the buckets launched since its last call and starts over; the
    profiler calls it once per optimizer step. Times come from the host clock on CPU (a gloo
    future completes when its all-reduce has) and from CUDA events on GPU (an NCCL future
    completes at launch, but an event recorded in its callback completes with the collective).
    """

    MAX_PENDING = 10_000
    """Buckets kept when nobody takes them (a run without the profiler must not grow)."""

    def __init__(self, *, hook: str, device: torch.device) -> None:
        self.hook = hook
        self.cuda = device.type == "cuda"
        self._lock = threading.Lock()
        self._pending: deque[_Bucket] = deque(maxlen=self.MAX_PENDING)

    def clock(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def launched(self, *, calls: int, nbytes: int, at: Any) -> _Bucket:
        bucket = _Bucket(calls=calls, nbytes=nbytes, launch=at)
        with self._lock:
            self._pending.append(bucket)
        return bucket

    def completed(self, bucket: _Bucket) -> None:
        bucket.done = self.clock()

    def take_step(self) -> StepComm:
        """This step's all-reduces (see `StepComm` for the keys and units); the next step starts empty."""
        with self._lock:
            buckets = list(self._pending)
            self._pending.clear()
        return StepComm(buckets, cuda=self.cuda)


def recording_hook(hook: Callable, stats: CommStats, *, wire_dtype: torch.dtype | None = None) -> Callable:
    """Wrap one of torch's comm hooks so each bucket's all-reduce is counted and timed in `stats`.

    wire_dtype: the dtype the hook casts a bucket to (fp16/bf16 hooks); None: the bucket's own.
    """

    # No annotations: DDP compares them with dist.GradBucket / Future[Tensor] by identity.
    def recorded(state, bucket):
        buffer = bucket.buffer()
        launch = stats.clock()
        if isinstance(state, powerSGD_hook.PowerSGDState) and state.iter >= state.start_powerSGD_iter:
            before = state.compression_stats()[2]
            future = hook(state, bucket)  # counts this bucket's compressed elements synchronously
            numel, calls = state.compression_stats()[2] - before, 3
        else:
            future = hook(state, bucket)
            numel, calls = buffer.numel(), 1
        itemsize = (wire_dtype or buffer.dtype).itemsize
        record = stats.launched(calls=calls, nbytes=numel * itemsize, at=launch)

        def done(fut: torch.futures.Future) -> torch.Tensor:
            stats.completed(record)
            return fut.value()

        return future.then(done)

    # Not torch's own name: DDP refuses a hook *named* bf16_compress_hook unless CUDA and NCCL
    # 2.10+; our checks decide instead, from what the backend really supports.
    recorded.__name__ = recorded.__qualname__ = f"recorded_{hook.__name__}"
    return recorded


def _torch_hook(cfg: DdpConfig, ctx: SetupContext) -> tuple[Callable, Any]:
    """torch's hook for `cfg.comm_hook` and its state."""
    if cfg.comm_hook == "fp16":
        return default_hooks.fp16_compress_hook, None
    if cfg.comm_hook == "bf16":
        return default_hooks.bf16_compress_hook, None
    if cfg.comm_hook == "powersgd":
        # Plain all-reduce for the first 10% of steps (torch's advice; its error feedback and warm
        # start need at least 2), then rank-r factors with error feedback.
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=max(2, ctx.total_steps // 10))
        return powerSGD_hook.powerSGD_hook, state
    return default_hooks.allreduce_hook, None  # the same fp32 average as DDP's built-in


def bucket_cap_mb(cfg: DdpConfig, backend: str, model: torch.nn.Module) -> float:
    """The bucket size to use: the configured one, except PowerSGD over gloo gets one bucket.

    PowerSGD launches its P and Q all-reduces from future callbacks and waits there. NCCL futures
    complete at launch, so those callbacks run inline in bucket order on every rank; gloo runs them
    on its worker threads, so with several buckets in flight the ranks issue them in different
    orders (mismatched sizes, a hang, or silently mixed data when sizes match; seen with torch's
    own hook). One bucket leaves one chain, the same on every rank.
    """
    if cfg.comm_hook != "powersgd" or backend != "gloo":
        return cfg.bucket_cap_mb
    grad_mb = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / 2**20
    return max(cfg.bucket_cap_mb, math.ceil(grad_mb) + 1.0)


def apply_ddp(setup: TrainSetup, cfg: DdpConfig, ctx: SetupContext) -> None:
    if ctx.world_size == 1:
        if cfg != DdpConfig():
            setup.note("ddp", "one process: nothing to synchronize, settings unused (DDP needs --nproc N / torchrun)")
        return
    device_ids = None
    if ctx.device.type == "cuda":
        # One GPU per rank: cuda:LOCAL_RANK, wherever the model was built; set as the current device
        # too, so the trainer's batches (sent to "cuda") land there.
        device = torch.device("cuda", local_rank())
        torch.cuda.set_device(device)
        setup.raw_model.to(device)
        device_ids = [device.index]
    backend = init_process_group(cfg, ctx)
    cap = bucket_cap_mb(cfg, backend, setup.raw_model)
    model = DistributedDataParallel(setup.model, device_ids=device_ids, bucket_cap_mb=cap,
                                    gradient_as_bucket_view=True)
    stats = CommStats(hook=cfg.comm_hook, device=ctx.device)
    hook, state = _torch_hook(cfg, ctx)
    model.register_comm_hook(state, recording_hook(hook, stats, wire_dtype=_WIRE_DTYPE.get(cfg.comm_hook)))
    setup.model, setup.no_sync, setup.comm_stats = model, model.no_sync, stats
    extra = f" (rank {cfg.powersgd_rank}, from step {state.start_powerSGD_iter})" if state is not None else ""
    buckets = f"buckets of {cap:g} MB"
    if cap != cfg.bucket_cap_mb:
        buckets += f" (not {cfg.bucket_cap_mb:g}: PowerSGD over gloo needs one bucket)"
    setup.note("ddp", f"{ctx.world_size} ranks over {backend}, {buckets}, comm hook {cfg.comm_hook}{extra}")


# --------------------------------------------------------------------------------------------
# Config-time checks


def _check_ranks(switches: SwitchesConfig, ctx: SetupContext) -> str | None:
    cfg = switches.ddp
    if cfg.comm_hook != "none" and ctx.world_size == 1:
        return f"comm_hook={cfg.comm_hook} needs several ranks: run with --nproc N / torchrun"
    if ctx.world_size > 1 and not dist.is_available():
        return "this torch was built without torch.distributed: several ranks cannot share gradients"
    return None


def _check_backend(switches: SwitchesConfig, ctx: SetupContext) -> str | None:
    cfg = switches.ddp
    if cfg.backend == "nccl" and (ctx.device.type != "cuda" or not torch.cuda.is_available()):
        return f"backend=nccl needs CUDA (device: {ctx.device}); use backend=gloo or auto"
    if cfg.backend == "nccl" and not (dist.is_available() and dist.is_nccl_available()):
        return "backend=nccl: this torch build has no NCCL; use backend=gloo or auto"
    return None


def _check_wire_dtype(switches: SwitchesConfig, ctx: SetupContext) -> str | None:
    cfg = switches.ddp
    dtype = _WIRE_DTYPE.get(cfg.comm_hook)
    if dtype is None or ctx.world_size == 1 or not dist.is_available():
        return None
    backend = resolve_backend(cfg, ctx.device)
    if backend == "gloo" and not gloo_all_reduces(dtype):
        return (f"comm_hook={cfg.comm_hook}: gloo in torch {torch.__version__} cannot all-reduce {dtype}; "
                "use fp16 or powersgd, or nccl on CUDA")
    if backend == "nccl" and dtype == torch.bfloat16 and torch.cuda.nccl.version() < (2, 10):
        return f"comm_hook=bf16 needs NCCL 2.10+ (this torch has {torch.cuda.nccl.version()}); use fp16"
    return None


def _check_timeout(switches: SwitchesConfig, ctx: SetupContext) -> str | None:
    if ctx.world_size == 1:
        return None
    try:
        dist_timeout_s()
    except ConfigError as exc:
        return str(exc)
    return None


OPTIMIZATION = Optimization(
    name="ddp", apply=apply_ddp, enabled=lambda c: c != DdpConfig(),
    addresses=("communication_bound",),
    effect="fp16/bf16 hooks halve the bytes of every gradient all-reduce and PowerSGD sends rank-r "
           "factors instead (tens of times fewer bytes); bigger buckets mean fewer, larger all-reduces",
    cost="a cast per bucket (fp16/bf16); PowerSGD adds matmuls per bucket and keeps an error-feedback "
         "copy of the gradients",
    risk="compression is lossy: fp16 can underflow small gradients, PowerSGD is biased (error feedback "
         "corrects it over steps); compare loss curves, not only step time",
    source="000 2.4; 004 2.2, 2.4, 4.1",
    needs="several ranks (torchrun --nproc_per_node N); nccl needs CUDA",
    checks=(_check_ranks, _check_backend, _check_wire_dtype, _check_timeout))
