"""Distributed data parallel: DDP and its gradient-compression comm hooks (000 2.4; 004 2.2, 2.4, 4.1).

Under torchrun (world size > 1) the model is wrapped in DistributedDataParallel, which packs
gradients into buckets and all-reduces each bucket as soon as backward has produced it, so the
communication overlaps the rest of backward. The source's loop of one blocking `dist.all_reduce`
per parameter after backward (000 2.4) is the opposite: as many collectives as parameters, none
overlapped. The comm hook chooses what a bucket sends: fp32 (none), fp16/bf16 (half the bytes),
or PowerSGD's rank-r factors. torch's own hooks are registered as they are, or, when the context
has a `wrap_comm_hook` (the profiler's communication counters), wrapped by it.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from optimizers.base import Optimization, SetupContext, Switches, TrainSetup
from optimizers.config import ConfigError, Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck, Capability

if TYPE_CHECKING:
    import torch


@dataclass
class DdpConfig(Section):
    KEY: ClassVar[str] = "switches.ddp"
    comm_hook: str = "none"
    """none (fp32 all-reduce), fp16 or bf16 (compress gradients), powersgd (low-rank)."""
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size; larger buckets mean fewer, bigger all-reduces."""
    powersgd_rank: int = 1
    backend: str = "auto"
    """auto (nccl on CUDA, gloo on CPU), gloo, nccl."""

    def __post_init__(self) -> None:
        self.check_choice("comm_hook", ["none", "fp16", "bf16", "powersgd"])
        self.check_range("bucket_cap_mb", lo=0.0, hi=2.0**20, lo_open=True)
        self.check_range("powersgd_rank", lo=1, hi=2**16)
        self.check_choice("backend", ["auto", "gloo", "nccl"])

TIMEOUT_ENV = "GLMPERF_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0


def _wire_dtype(comm_hook: str) -> torch.dtype | None:
    """The dtype a compressing hook sends gradients in; None: they travel in their own."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(comm_hook)


def local_rank() -> int:
    """This process's GPU index on its node, from torchrun's environment."""
    return int(os.environ.get("LOCAL_RANK", 0))


def resolve_backend(cfg: DdpConfig, device: torch.device) -> str:
    """auto: NCCL for CUDA tensors, gloo for CPU tensors."""
    import torch.distributed as dist

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
    import torch
    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=10))
    try:
        # torch's stubs declare allreduce on ProcessGroup only; its backends (gloo here) have it at run time too
        group.allreduce([torch.zeros(2, dtype=dtype)]).wait()  # type: ignore[attr-defined]
    except RuntimeError:
        return False
    return True


def init_process_group(cfg: DdpConfig, ctx: SetupContext) -> str:
    """Join torchrun's group (env://) unless the caller already has; returns the backend."""
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_backend()
    backend = resolve_backend(cfg, ctx.device)
    dist.init_process_group(backend, timeout=timedelta(seconds=dist_timeout_s()))
    return backend


# No annotations: DDP compares them with dist.GradBucket / Future[Tensor] by identity.
def _bf16_hook(state, bucket):
    """torch's bf16_compress_hook under another name: DDP refuses a hook *named* bf16_compress_hook
    unless CUDA and NCCL 2.10+; our checks decide instead, from what the backend really supports."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


def _torch_hook(cfg: DdpConfig, ctx: SetupContext) -> tuple[Callable, Any]:
    """torch's hook for `cfg.comm_hook` and its state."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if cfg.comm_hook == "fp16":
        return default_hooks.fp16_compress_hook, None
    if cfg.comm_hook == "bf16":
        return _bf16_hook, None
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
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if setup.mesh is not None:
        setup.note("ddp", "not applied: the parallel layout synchronizes gradients itself (switches.parallel)")
        return
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
    hook, state = _torch_hook(cfg, ctx)
    if ctx.wrap_comm_hook is not None:
        hook = ctx.wrap_comm_hook(hook, _wire_dtype(cfg.comm_hook))
    model.register_comm_hook(state, hook)
    setup.model, setup.no_sync = model, model.no_sync
    extra = f" (rank {cfg.powersgd_rank}, from step {state.start_powerSGD_iter})" if state is not None else ""
    buckets = f"buckets of {cap:g} MB"
    if cap != cfg.bucket_cap_mb:
        buckets += f" (not {cfg.bucket_cap_mb:g}: PowerSGD over gloo needs one bucket)"
    setup.note("ddp", f"{ctx.world_size} ranks over {backend}, {buckets}, comm hook {cfg.comm_hook}{extra}")


# --------------------------------------------------------------------------------------------
# Config-time checks


def _check_ranks(switches: Switches, ctx: SetupContext) -> str | None:
    import torch.distributed as dist

    cfg = switches.ddp
    if cfg.comm_hook != "none" and ctx.world_size == 1:
        return f"comm_hook={cfg.comm_hook} needs several ranks: run with --nproc N / torchrun"
    if ctx.world_size > 1 and not dist.is_available():
        return "this torch was built without torch.distributed: several ranks cannot share gradients"
    return None


def _check_backend(switches: Switches, ctx: SetupContext) -> str | None:
    import torch
    import torch.distributed as dist

    cfg = switches.ddp
    if cfg.backend == "nccl" and (ctx.device.type != "cuda" or not torch.cuda.is_available()):
        return f"backend=nccl needs CUDA (device: {ctx.device}); use backend=gloo or auto"
    if cfg.backend == "nccl" and not (dist.is_available() and dist.is_nccl_available()):
        return "backend=nccl: this torch build has no NCCL; use backend=gloo or auto"
    return None


def _check_wire_dtype(switches: Switches, ctx: SetupContext) -> str | None:
    import torch
    import torch.distributed as dist

    cfg = switches.ddp
    dtype = _wire_dtype(cfg.comm_hook)
    if dtype is None or ctx.world_size == 1 or not dist.is_available():
        return None
    backend = resolve_backend(cfg, ctx.device)
    if backend == "gloo" and not gloo_all_reduces(dtype):
        return (f"comm_hook={cfg.comm_hook}: gloo in torch {torch.__version__} cannot all-reduce {dtype}; "
                "use fp16 or powersgd, or nccl on CUDA")
    if backend == "nccl" and dtype == torch.bfloat16 and torch.cuda.nccl.version() < (2, 10):
        return f"comm_hook=bf16 needs NCCL 2.10+ (this torch has {torch.cuda.nccl.version()}); use fp16"
    return None


def _check_timeout(switches: Switches, ctx: SetupContext) -> str | None:
    if ctx.world_size == 1:
        return None
    try:
        dist_timeout_s()
    except ConfigError as exc:
        return str(exc)
    return None


_BYTES = ("docs/optimizations.md, ddp (2 gloo ranks, tiny): payload per step none 528,640 B, fp16 264,320 B, "
          "PowerSGD rank 1 14,112 B (37x fewer)")

OPTIMIZATION = Optimization(
    name="ddp", config=DdpConfig, apply=apply_ddp, enabled=lambda c: c != DdpConfig(),
    addresses=(Bottleneck.COMM_BOUND,),
    effect="fp16/bf16 hooks halve the bytes of every gradient all-reduce and PowerSGD sends rank-r "
           "factors instead (tens of times fewer bytes); bigger buckets mean fewer, larger all-reduces",
    cost="a cast per bucket (fp16/bf16); PowerSGD adds matmuls per bucket and keeps an error-feedback "
         "copy of the gradients",
    risk="compression is lossy: fp16 can underflow small gradients, PowerSGD is biased (error feedback "
         "corrects it over steps); compare loss curves, not only step time",
    source="000 2.4; 004 2.2, 2.4, 4.1",
    needs="several ranks (torchrun --nproc_per_node N); nccl needs CUDA",
    checks=(_check_ranks, _check_backend, _check_wire_dtype, _check_timeout), always=True,
    candidates=(
        Candidate(set={"switches.ddp.comm_hook": "fp16"}, applies=lambda c: c.comm_hook == "none",
                  requires=(Capability.SEVERAL_RANKS,), risk="numerics",
                  effects=(Effect("comm_bytes", "shrinks", 0.5, 0.5, basis=_BYTES),
                           Effect("comm", "shrinks", 0.3, 0.5,
                                  basis="half the bytes; all-reduce time follows them where bandwidth-bound, "
                                        "less the cast (not timed)"))),
        Candidate(set={"switches.ddp.comm_hook": "powersgd"}, applies=lambda c: c.comm_hook != "powersgd",
                  requires=(Capability.SEVERAL_RANKS,), risk="convergence",
                  effects=(Effect("comm_bytes", "shrinks", 0.9, 0.97, basis=_BYTES + "; larger matrices gain more"),
                           Effect("comm", "shrinks", 0.5, 0.9,
                                  basis="far fewer bytes, less PowerSGD's matmuls per bucket (not timed); over "
                                        "gloo it runs as one bucket, which nothing overlaps"),
                           Effect("peak_memory", "grows", 0.05, 0.25,
                                  basis="an fp32 error-feedback copy of the gradients (4 bytes/param) over 16 "
                                        "bytes/param of weights, grads and AdamW state, less with activations")),
                  note="biased compression corrected over steps by error feedback: compare loss curves"),
    ))
