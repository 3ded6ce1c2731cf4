"""Per-rank memory and communication of a run's parallel layout, computed without running it.

`plan(cfg, nproc)` answers "does this config fit, and what does a step send?" before anyone pays
for the devices, on any machine (a CPU laptop planning a GPU run):

- parameters, gradients and optimizer state: from the real model built on the meta device (no
  memory), each parameter sliced as the layout slices it: tensor parallelism by the plan of
  `optimizers.tensor_parallel`, pipeline ranks by chunks of blocks, FSDP on dim 0 rounded up
  (as `fully_shard` pads), fp32 master weights and gradients, the optimizer's state per element;
- activations: the real model's forward traced under FakeTensorMode (shapes only, as torchtitan's
  memory estimator does) at a rank's local shapes, counting the distinct storages autograd saves
  for backward and the logits (`saved_bytes`, the same count a run measures), then scaled by the
  blocks a rank holds, the micro-batches a pipeline schedule keeps in flight, and checkpointing
  (profiler.advice.plan_activations);
- buffers: what FSDP gathers while a unit computes, in the dtype it gathers, or autocast's copies;
- communication per optimizer step, by collective, as payload bytes (profiler.advice.plan_comm).

What it leaves out is listed in `Plan.assumptions`. The layout is checked with the checks runs use
(`optimizers.parallel.LAYOUT_CHECKS`), so a plan refuses what a run would refuse.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from optimizers import ConfigError
from optimizers.parallel import LAYOUT_CHECKS, Layout, ParallelConfig, layout
from optimizers.tensor_parallel import sharded_dim
from profiler.advice.plan_activations import activation_bytes, micro_batches_in_flight, trace_activations
from profiler.advice.plan_comm import comm_bytes
from profiler.config import RunConfig, build_run_config
from reference_model.context import setup_context
from reference_model.model import GLMForCausalLM

OPTIMIZER_STATES: dict[str, Callable[[Any], int]] = {
    "adamw": lambda c: 2, "sgd": lambda c: int(c.momentum > 0), "rmsprop": lambda c: 1 + int(c.momentum > 0),
    "adagrad": lambda c: 1,
}
"""fp32 state tensors per parameter element, by optimizer (AdamW: exp_avg, exp_avg_sq)."""

STEP_SCALAR = {"adamw": 4, "sgd": 0, "rmsprop": 4, "adagrad": 4}
"""Bytes of the per-parameter `step` counter each optimizer keeps (a float32 scalar tensor)."""

_DTYPE_BYTES = {"off": 4, "bf16": 2, "fp16": 2}


@dataclass
class Plan:
    """Per-rank bytes (the busiest rank: the largest pipeline stage, FSDP's rounded-up shard) and
    per-step communication of one config on `nproc` ranks."""

    preset: str
    nproc: int
    layout: Layout
    micro_batch: int
    """Samples per forward on a rank (a pipeline's micro-batch)."""
    per_rank_bytes: dict[str, int]
    """params, grads, optimizer, activations, buffers, total."""
    per_stage_bytes: list[dict[str, int]]
    """The same for a rank of each pipeline stage (one entry without a pipeline); per_rank_bytes is the
    stage with the largest total."""
    precision: dict[str, str]
    """The dtype each part is held in."""
    activations_by_checkpointing: dict[str, int]
    """Activation bytes per rank with checkpointing off, full, and selective every 2."""
    comm_bytes_per_step: dict[str, int]
    """all_gather, reduce_scatter, all_reduce, send_recv, total: payload bytes per optimizer step."""
    bubble: float | None
    """A pipeline's idle share of the step, (p-1)/(v*m+p-1); None without one."""
    capacity_bytes: int | None = None
    advice: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.per_rank_bytes["total"] <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["layout"] = dataclasses.asdict(self.layout)
        out["fits"] = self.fits
        return out


def _param_table(cfg: RunConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every distinct parameter of the real model, built on the meta device."""
    with torch.device("meta"):
        model = GLMForCausalLM(cfg.model)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def _stage_of(name: str, layers: int, pp: int, chunks: int) -> int:
    """The pipeline rank holding a parameter: blocks in consecutive chunks, chunk c on rank c mod pp, the
    embedding first, the final norm and lm_head last."""
    if name.startswith("model.layers."):
        return int(name.split(".")[2]) // (layers // (pp * chunks)) % pp
    return 0 if name.startswith("model.embed_tokens") else pp - 1


def _local_numel(name: str, shape: tuple[int, ...], lay: Layout) -> tuple[int, int]:
    """(elements a rank holds, elements of the tp-local, unsharded tensor FSDP gathers)."""
    local = list(shape)
    if name.startswith("model.layers.") and lay.tp > 1:
        dim = sharded_dim(name.split(".", 3)[3])
        if dim is not None:
            local[dim] //= lay.tp
    gathered = math.prod(local)
    if lay.fsdp > 1:
        local[0] = math.ceil(local[0] / lay.fsdp)  # fully_shard pads dim 0 to a multiple of the degree
    return math.prod(local), gathered


def check_layout(cfg: RunConfig, nproc: int) -> None:
    """Raise ConfigError naming the degrees when the layout cannot run on `nproc` ranks."""
    if nproc < 1:
        raise ConfigError("--nproc", f"got {nproc}; allowed: an integer >= 1")
    ctx = setup_context(cfg.train, cfg.data, device=torch.device("cpu"), rank=0, world_size=nproc, model=cfg.model)
    for check in LAYOUT_CHECKS:
        reason = check(cfg.switches, ctx)
        if reason:
            raise ConfigError("switches.parallel", reason)


def plan(cfg: RunConfig, nproc: int, *, capacity_bytes: int | None = None, advise: bool = True) -> Plan:
    """The plan of `cfg` on `nproc` ranks; `capacity_bytes` (one device's memory) for the verdict."""
    check_layout(cfg, nproc)
    par: ParallelConfig = cfg.switches.parallel
    lay = layout(par, nproc)
    amp = cfg.switches.amp.dtype
    compute = _DTYPE_BYTES[amp]
    gather_bytes = compute if lay.fsdp_wraps else 4  # FSDP's policy gathers in the autocast dtype
    m = par.pipeline_microbatches if lay.pp > 1 else 1
    micro = cfg.train.batch_size // m
    accumulation = cfg.switches.grad_accumulation.steps
    layers = cfg.model.num_hidden_layers

    held = [0] * lay.pp  # elements a rank of each stage holds
    tensors = [0] * lay.pp  # parameter tensors per stage (the optimizer's step counters)
    units: list[list[int]] = [[] for _ in range(lay.pp)]  # FSDP units' gathered elements per stage
    root = [0] * lay.pp
    matmul = [0] * lay.pp  # elements of the weights a matmul reads (autocast copies them)
    block_units: dict[str, int] = {}
    for name, shape in _param_table(cfg):
        stage = _stage_of(name, layers, lay.pp, par.chunks_per_rank)
        local, gathered = _local_numel(name, shape, lay)
        held[stage] += local
        tensors[stage] += 1
        matmul[stage] += gathered if len(shape) == 2 and not name.startswith("model.embed_tokens") else 0
        if name.startswith("model.layers."):
            key = ".".join(name.split(".")[:3])
            block_units[key] = block_units.get(key, 0) + gathered
        else:
            root[stage] += gathered
    for key, numel in block_units.items():
        units[_stage_of(key + ".", layers, lay.pp, par.chunks_per_rank)].append(numel)
    opt = cfg.switches.optimizer
    states = OPTIMIZER_STATES[opt.name](opt)
    trace = trace_activations(cfg, tp=lay.tp, micro_batch=micro, stages=lay.pp > 1)
    stage_layers = layers // lay.pp
    ac = cfg.switches.activation_checkpointing

    def activations(s: int, mode: str, every: int) -> int:
        if lay.pp == 1:
            return activation_bytes(trace, stage_layers, mode, every=every, extra=trace.rest, in_flight=1)
        in_flight = micro_batches_in_flight(par, lay.pp, m, s)
        extra = trace.stage_rest[0 if s == 0 else 2 if s == lay.pp - 1 else 1]
        done = round((m - in_flight) * trace.logits) if s == lay.pp - 1 else 0
        return activation_bytes(trace, stage_layers, mode, every=every, extra=extra, in_flight=in_flight) + done

    def rank_bytes(s: int) -> dict[str, int]:
        if lay.fsdp_wraps and lay.pp > 1:  # every block gathered by the end, with its unsharded gradient
            buffers = 2 * gather_bytes * (root[s] + sum(units[s]))
        elif lay.fsdp_wraps:  # gathered in the compute dtype, so autocast copies nothing
            blocks_gathered = units[s] if not par.reshard_after_forward else sorted(units[s])[-2:]
            buffers = gather_bytes * (root[s] + sum(blocks_gathered))
        else:  # autocast's copy of each matmul weight, made once per step and kept for backward
            buffers = compute * matmul[s] if amp != "off" else 0
        parts = {"params": 4 * held[s], "grads": 4 * held[s],
                 "optimizer": 4 * states * held[s] + STEP_SCALAR[opt.name] * tensors[s],
                 "activations": activations(s, ac.mode, ac.every), "buffers": buffers}
        return {**parts, "total": sum(parts.values())}

    by_stage = [rank_bytes(s) for s in range(lay.pp)]
    stage = max(range(lay.pp), key=lambda s: by_stage[s]["total"])
    per_rank = by_stage[stage]
    by_ac = {mode: activations(stage, mode, 2) for mode in ("off", "full", "selective")}
    comm = comm_bytes(cfg, lay, par, gathered_stage=(sum(units[stage]), root[stage]), grads_held=held[stage],
                       micro=micro, m=m, accumulation=accumulation, stage_layers=stage_layers,
                       compute=compute, gather_bytes=gather_bytes)
    v = par.chunks_per_rank
    bubble = (lay.pp - 1) / (v * m + lay.pp - 1) if lay.pp > 1 else None
    result = Plan(preset=cfg.model.preset, nproc=nproc, layout=lay, micro_batch=micro, per_rank_bytes=per_rank,
                  per_stage_bytes=by_stage,
                  precision={"params": "fp32", "grads": "fp32", "optimizer": "fp32",
                             "activations": "fp32" if amp == "off" else f"{amp} matmul outputs, fp32 residual",
                             "buffers": "fp32" if amp == "off" else amp},
                  activations_by_checkpointing=by_ac, comm_bytes_per_step=comm, bubble=bubble,
                  capacity_bytes=capacity_bytes,
                  assumptions=_assumptions(lay, par, micro_batches_in_flight(par, lay.pp, m, stage), stage, amp))
    if advise and capacity_bytes is not None and result.fits is False:
        result.advice = _advice(cfg, nproc, capacity_bytes)
    return result


def _assumptions(lay: Layout, par: ParallelConfig, in_flight: float, stage: int, amp: str) -> list[str]:
    said = [
        "parameters, gradients and optimizer state in fp32 (autocast keeps fp32 master weights)",
        "activations as autograd saves them for this model's kernels, traced on the CPU at the rank's local "
        "shapes; a CUDA run's attention kernel may save a little more or less",
        "allocator fragmentation, the CUDA context (~0.5-1 GB) and transient workspaces are not counted",
        "communication is payload bytes per optimizer step, not link time",
    ]
    if lay.fsdp_wraps and lay.pp > 1:
        said.append("FSDP buffers on a pipeline stage: every block and the root gathered, and their gradients "
                    "accumulated unsharded over the micro-batches until the step's one reduce-scatter "
                    "(torch.distributed.pipelining), both in the dtype FSDP gathers")
    elif lay.fsdp_wraps:
        said.append("FSDP buffers: the root unit and " + ("two blocks (the current and the prefetched one)"
                    if par.reshard_after_forward else "every block (reshard_after_forward=false)")
                    + " gathered at once")
    elif amp != "off":
        said.append(f"buffers: autocast's {amp} copy of every matmul weight the rank holds, made once per step "
                    "(autocast caches it for every micro-batch of a pipeline) and kept until backward")
    if lay.pp > 1:
        said.append(f"pipeline: the busiest rank is stage {stage} of {lay.pp}, which keeps {in_flight:g} "
                    f"micro-batch(es) of activations in flight ({par.schedule}) and each one's output for its "
                    "backward; stages hold consecutive blocks, the embedding on the first, lm_head on the last")
    if lay.tp > 1:
        said.append("tensor parallel: attention and MLP split by heads and width; norms, embedding and lm_head "
                    "whole on each tp rank")
    return said


def _with(cfg: RunConfig, **settings: Any) -> RunConfig:
    """`cfg` with dotted keys replaced (`{"switches.parallel.fsdp": 8}`)."""
    data = cfg.to_dict()
    for key, value in settings.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = value
    return build_run_config(data)


def _advice(cfg: RunConfig, nproc: int, capacity: int) -> list[str]:
    """Single switches that would make the plan fit, with the per-rank total each gives."""
    par = cfg.switches.parallel
    tries: list[dict[str, Any]] = []
    if cfg.switches.activation_checkpointing.mode != "full":
        tries.append({"switches.activation_checkpointing.mode": "full"})
    free = nproc // (par.tp * par.pp)
    for fsdp in range(par.fsdp + 1, free + 1):
        if free % fsdp == 0:
            tries.append({"switches.parallel.fsdp": fsdp})
    if cfg.switches.amp.dtype == "off":
        tries.append({"switches.amp.dtype": "bf16"})
    if cfg.train.batch_size > 1:
        tries.append({"train.batch_size": cfg.train.batch_size // 2})
    advice = []
    for change in tries:
        try:
            other = plan(_with(cfg, **change), nproc, capacity_bytes=capacity, advise=False)
        except ConfigError:
            continue
        if other.fits:
            text = ", ".join(f"--set {k}={v}" for k, v in change.items())
            advice.append(f"{text}: {other.per_rank_bytes['total'] / 1e9:.1f} GB per rank")
    if not advice:
        advice.append("no single switch fits it: combine fsdp over every rank with activation checkpointing, "
                      "or add ranks")
    return advice
