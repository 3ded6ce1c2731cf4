"""Parallel layouts: the device mesh of data x fully-sharded x tensor x pipeline parallelism (000 ch.5; 004 4.2).

`switches.parallel` names the degrees of the model-sharding techniques; data parallelism is what is
left of the world size: dp = world / (fsdp x tp x pp). The mesh's dims are, outermost first,
pp, dp, fsdp, tp (torchtitan's order: tensor parallelism innermost, on the fastest links, since it
communicates inside every block; pipeline stages outermost, since they exchange only activations).

Each technique is its own module and its own place in the catalog's pipeline (optimizers.catalog):
this one checks the layout at config time and builds the mesh; `tensor_parallel` splits the
attention and MLP matmuls before activation checkpointing and compile wrap the blocks; `fsdp`
shards parameters, gradients and optimizer state after them, per block and then the root. With
every degree 1 nothing happens here and several ranks are plain DDP (optimizers.ddp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from optimizers.base import ModelShape, Optimization, SetupContext, Switches, TrainSetup
from optimizers.config import Section
from optimizers.ddp import DdpConfig, init_process_group, local_rank
from optimizers.facts import Candidate, Derived, Effect
from optimizers.vocabulary import Bottleneck, Capability

if TYPE_CHECKING:
    import torch

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
MESH_DIMS = ("pp", "dp", "fsdp", "tp")

MAX_RANKS = 2**17
"""The most ranks a run or a plan may have (and so any one degree): beyond the largest clusters built."""


@dataclass
class ParallelConfig(Section):
    KEY: ClassVar[str] = "switches.parallel"
    fsdp: int = 1
    """Ranks that shard parameters, gradients and optimizer state (FSDP2 `fully_shard`); each holds 1/fsdp."""
    reshard_after_forward: bool = True
    """fsdp: free the gathered parameters after each block's forward and gather them again in backward
    (ZeRO-3); false keeps them gathered until backward (ZeRO-2-like: less communication, more memory)."""
    tp: int = 1
    """Ranks that split each block's attention heads and MLP width (Megatron colwise/rowwise)."""
    sequence_parallel: bool = False
    """tp: also split the residual stream and the block norms along the sequence (less activation memory
    per rank; each all-reduce becomes a reduce-scatter and an all-gather of the same bytes)."""
    pp: int = 1
    """Pipeline stages: the blocks are cut into pp consecutive groups, one per stage."""
    schedule: str = "1f1b"
    """pp: gpipe (all forwards, then all backwards), 1f1b, or interleaved_1f1b (virtual stages)."""
    microbatches: int = 0
    """pp: micro-batches each batch is split into (0: as many as stages)."""
    virtual_stages: int = 2
    """interleaved_1f1b: model chunks per pipeline rank."""

    def __post_init__(self) -> None:
        for name in ("fsdp", "tp", "pp"):
            self.check_range(name, lo=1, hi=MAX_RANKS)
        self.check_range("virtual_stages", lo=1, hi=1024)
        self.check_range("microbatches", lo=0, hi=2**16)
        self.check_choice("schedule", SCHEDULES)

    @property
    def model_parallel(self) -> int:
        """Ranks one data-parallel replica spans: fsdp x tp x pp."""
        return self.fsdp * self.tp * self.pp

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks each pipeline rank runs: virtual_stages under interleaved 1F1B, else one."""
        return self.virtual_stages if self.schedule == "interleaved_1f1b" else 1

    @property
    def pipeline_microbatches(self) -> int:
        return self.microbatches or self.pp


@dataclass(frozen=True)
class Layout:
    """How a world of ranks is cut: degrees of every mesh dim, dp the remainder."""

    dp: int
    fsdp: int
    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp

    @property
    def fsdp_wraps(self) -> bool:
        """Whether FSDP2 wraps the model: to shard it, or to all-reduce the gradients of data replicas of a
        tensor-parallel or pipelined model (shards of one rank: no all-gather, no reduce-scatter), whose
        DTensor parameters and pipeline stages DDP does not wrap."""
        return self.fsdp > 1 or (self.dp > 1 and self.tp * self.pp > 1)

    @property
    def sharded(self) -> bool:
        """Whether a mesh is needed (anything but plain data parallel)."""
        return self.fsdp * self.tp * self.pp > 1

    def describe(self) -> str:
        return " x ".join(f"{name}={getattr(self, name)}" for name in ("dp", "fsdp", "tp", "pp"))


def layout(cfg: ParallelConfig, world_size: int) -> Layout:
    """The layout of `cfg` on `world_size` ranks (assumes `layout_problem` found none)."""
    return Layout(dp=max(1, world_size // cfg.model_parallel), fsdp=cfg.fsdp, tp=cfg.tp, pp=cfg.pp)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def layout_problem(cfg: ParallelConfig, world_size: int, shape: ModelShape | None, *,
                   batch_size: int, seq_len: int) -> str | None:
    """Why `cfg` cannot be laid out on `world_size` ranks for a model of `shape`, or None.

    Names the degrees and what they must divide, so the fix is in the message.
    """
    product = cfg.model_parallel
    if world_size % product:
        return (f"fsdp={cfg.fsdp} x tp={cfg.tp} x pp={cfg.pp} = {product} does not divide the world size "
                f"{world_size}; their product must divide it (data parallelism takes the rest): "
                f"allowed products: {_divisors(world_size)}")
    if cfg.pp > 1:
        micro = cfg.pipeline_microbatches
        if batch_size % micro:
            return (f"microbatches={micro} does not divide train.batch_size={batch_size}; allowed: "
                    f"{_divisors(batch_size)}")
        if cfg.schedule == "interleaved_1f1b" and micro % cfg.pp:
            return f"interleaved_1f1b needs microbatches ({micro}) to be a multiple of pp={cfg.pp}"
    if cfg.sequence_parallel and cfg.tp == 1:
        return "sequence_parallel=true splits the sequence over tensor-parallel ranks: it needs tp > 1"
    if cfg.sequence_parallel and seq_len % cfg.tp:
        return (f"sequence_parallel with tp={cfg.tp} does not divide data.seq_len={seq_len}: each rank holds an "
                f"equal share of the sequence; allowed tp: {_divisors(seq_len)}")
    if shape is None:
        return None
    if cfg.tp > 1:
        for what, size in (("num_attention_heads", shape.num_heads), ("num_key_value_heads", shape.num_kv_heads),
                           ("intermediate_size", shape.intermediate_size)):
            if size % cfg.tp:
                return (f"tp={cfg.tp} does not divide {what}={size}: each tensor-parallel rank holds whole "
                        f"heads (query and key/value alike, so grouped-query attention keeps its groups) and "
                        f"an equal share of the MLP width; allowed tp: "
                        f"{_divisors(math.gcd(shape.num_heads, shape.num_kv_heads, shape.intermediate_size))}")
    if cfg.pp > 1:
        chunks = cfg.pp * cfg.chunks_per_rank
        if shape.num_layers % chunks:
            return (f"pp={cfg.pp}" + (f" x virtual_stages={cfg.virtual_stages}" if chunks != cfg.pp else "")
                    + f" = {chunks} stages do not divide num_hidden_layers={shape.num_layers}; allowed: a "
                    f"divisor of it ({_divisors(shape.num_layers)})")
    return None


def _check_layout(switches: Switches, ctx: SetupContext) -> str | None:
    return layout_problem(switches.parallel, ctx.world_size, ctx.shape, batch_size=ctx.batch_size,
                          seq_len=ctx.seq_len)


# Switches that change the blocks in ways a sharded layout cannot follow: reason beside each.
_CONFLICTS = (
    ("param_sharing", lambda s: s.param_sharing.mode != "off",
     "one block's parameters run at several positions, which a pipeline cannot cut and FSDP cannot "
     "gather once per position"),
    ("ffn_pruning", lambda s: s.ffn_pruning.mode != "off",
     "its masks and narrowed widths act on whole weights, not on shards"),
    ("dynamic_batch", lambda s: s.dynamic_batch.mode != "off",
     "every rank of a sharded layout must run the same batch size at every step"),
)


def _check_conflicts(switches: Switches, ctx: SetupContext) -> str | None:
    cfg = switches.parallel
    if cfg.model_parallel == 1:
        return None
    for name, active, why in _CONFLICTS:
        if active(switches):
            return f"fsdp={cfg.fsdp}, tp={cfg.tp}, pp={cfg.pp} cannot run with switches.{name}: {why}"
    return None


def _check_trainer(switches: Switches, ctx: SetupContext) -> str | None:
    """What the reference trainer does not run, though a layout may be planned with it."""
    cfg = switches.parallel
    if cfg.model_parallel == 1:
        return None
    if cfg.pp > 1:
        if switches.grad_accumulation.steps > 1:
            return (f"pp={cfg.pp} with grad_accumulation={switches.grad_accumulation.steps}: the schedule's "
                    "micro-batches are the accumulation; raise switches.parallel.microbatches instead")
        if ctx.objective != "causal":
            return f"pp={cfg.pp}: stages pass hidden states only, so no attention mask; allowed: data.objective=causal"
    if switches.amp.dtype == "fp16":
        return (f"fsdp={cfg.fsdp}, tp={cfg.tp}, pp={cfg.pp} with amp=fp16: the GradScaler does not unscale "
                "sharded or pipelined gradients; use amp=bf16")
    return None


LAYOUT_CHECKS = (_check_layout, _check_conflicts)
"""The checks a layout must pass wherever it runs (`glmperf plan` applies these alone)."""


def build_mesh(lay: Layout, device: torch.device) -> torch.distributed.device_mesh.DeviceMesh:
    """The (pp, dp, fsdp, tp) device mesh over every rank of the default group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (lay.pp, lay.dp, lay.fsdp, lay.tp), mesh_dim_names=MESH_DIMS)


def apply_parallel(setup: TrainSetup, cfg: ParallelConfig, ctx: SetupContext) -> None:
    """Join the process group and build the mesh; the loader then shards data by data-parallel replica."""
    import torch

    lay = layout(cfg, ctx.world_size)
    if ctx.device.type == "cuda":
        device = torch.device("cuda", local_rank())
        torch.cuda.set_device(device)
        setup.raw_model.to(device)
    backend = init_process_group(DdpConfig(), ctx)
    mesh = build_mesh(lay, ctx.device)
    setup.mesh = mesh
    # the batch is split over dp x fsdp: both are replicas of the data; tp and pp ranks share a batch
    setup.data_shard = (mesh.get_local_rank("dp") * lay.fsdp + mesh.get_local_rank("fsdp"), lay.dp * lay.fsdp)
    setup.note("parallel", f"{ctx.world_size} ranks over {backend} as {lay.describe()} "
                           f"(mesh pp x dp x fsdp x tp); data split {setup.data_shard[1]} ways")


OPTIMIZATION = Optimization(
    name="parallel", config=ParallelConfig, apply=apply_parallel, enabled=lambda c: c.model_parallel > 1,
    addresses=(Bottleneck.MEMORY_BOUND, Bottleneck.COMM_BOUND),
    effect="fsdp=N keeps 1/N of the parameters, gradients and optimizer state on each rank (the model "
           "states of a large model dominate its memory); tp=N splits each block's weights and most "
           "activations N ways; pp=N holds 1/N of the blocks per rank",
    cost="fsdp all-gathers every block's parameters in forward (and again in backward with "
         "reshard_after_forward) and reduce-scatters gradients: about 1.5x DDP's bytes; tp all-reduces "
         "activations twice per block in forward and in backward; pp idles (p-1)/(m+p-1) of a step "
         "((p-1)/(v*m+p-1) with v chunks a rank under interleaved 1F1B, v times the sends)",
    risk="same results up to the order of floating-point sums; a layout that does not divide the "
         "heads, layers or world size is refused",
    source="000 ch.5 (ZeRO-3 with tensor parallelism on an 8-GPU node); 004 4.2",
    needs="several ranks (torchrun --nproc_per_node N) whose number the degrees' product divides",
    checks=(_check_layout, _check_conflicts, _check_trainer),
    candidates=(
        Candidate(set={"switches.parallel.fsdp": lambda fsdp: fsdp * 2}, requires=(Capability.SEVERAL_RANKS,),
                  effects=(Effect("peak_memory", "shrinks", 0.2, 0.5,
                                  basis="docs/BENCHMARKS.md section 12: fsdp=2 holds half of DDP's parameter, "
                                        "gradient and optimizer bytes per rank; activations are not sharded"),
                           Effect("comm_bytes", "grows", 0.4, 0.6,
                                  basis="all-gather in forward and backward plus reduce-scatter: 1.5x the "
                                        "bytes of one all-reduce of the gradients")),
                  note="ranks hold 1/fsdp of the model states"),
        Candidate(set={"switches.parallel.reshard_after_forward": False},
                  applies=lambda c: c.fsdp > 1 and c.reshard_after_forward,
                  effects=(Effect("backward", "shrinks", 0.3, 0.5, scales_with="comm_exposed.all_gather",
                                  basis="backward no longer gathers the blocks again: of a step's all-gathers "
                                        "(the blocks and the root in forward, the blocks again in backward) "
                                        "the regather is blocks / (2 x blocks + root), 41% on tiny, near 50% "
                                        "when the blocks outweigh the root"),),
                  note="every rank keeps its gathered blocks from forward to backward: the whole model "
                       "unsharded by the end of forward (`glmperf plan` computes the new per-rank bytes)"),
        Candidate(set={"switches.parallel.microbatches": Derived(
                      ("switches.parallel.microbatches", "switches.parallel.pp"), lambda m, pp: 2 * (m or pp))},
                  applies=lambda c: c.pp > 1, requires=(Capability.NOT_HOST_BOUND,),
                  effects=(Effect("forward", "shrinks", 0.2, 0.5, scales_with="comm_exposed.send_recv",
                                  basis="a stage idles (p-1)/(m+p-1) of the schedule; twice the micro-batches "
                                        "cut that by 1 - (m+p-1)/(2m+p-1): 36% (p=m=4) to 47% (p=2, m=8), "
                                        "less what smaller micro-batches lose in matmul efficiency"),),
                  note="twice the micro-batches, each half the size: the bubble shrinks, the sends double"),
    ),
)
