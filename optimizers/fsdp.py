"""Fully sharded data parallel (FSDP2 `fully_shard`, ZeRO-3; 000 ch.5): a stage of `switches.parallel`.

Every parameter becomes a DTensor sharded on dim 0 over the mesh's fsdp dim, so each rank holds
1/fsdp of the parameters and, since gradients and optimizer state follow their parameters, of
those too. Each block is its own unit (its parameters are all-gathered just before its forward and
its gradients reduce-scattered as soon as its backward ends, overlapping the neighbours' compute);
the root unit, applied last, holds the rest (embedding, final norm, lm_head; on a pipeline stage,
what the stage keeps of them). With dp > 1 as well
the mesh is 2-D (HSDP): shards within fsdp, replicas across dp, whose gradients are all-reduced. Replicas
of a tensor-parallel or pipelined model synchronize this way too, with shards of one rank (fsdp=1): FSDP2
then gathers nothing and all-reduces the gradients across dp, where DDP cannot wrap DTensors or a stage.

`reshard_after_forward` chooses ZeRO-3 (free after forward, gather again in backward) or a
ZeRO-2-like layout (keep the gathered block until backward: one all-gather less per block, the
whole unsharded model in memory by the end of forward). Under amp=bf16 the mixed precision policy
gathers bf16 parameters (half the bytes) and reduces gradients in fp32, as torchtitan does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimizers.base import SetupContext, Stage, TrainSetup, blocks
from optimizers.parallel import ParallelConfig, layout

if TYPE_CHECKING:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy


def mixed_precision(autocast_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """Parameters gathered in the autocast dtype, gradients reduced in fp32 (None: fp32 throughout)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy  # imported when a run shards, not at every start

    return MixedPrecisionPolicy(param_dtype=autocast_dtype, reduce_dtype=torch.float32)


def apply_fsdp(setup: TrainSetup, cfg: ParallelConfig, ctx: SetupContext) -> None:
    from torch.distributed.fsdp import fully_shard

    lay = layout(cfg, ctx.world_size)
    if not lay.fsdp_wraps:
        return
    mesh = setup.mesh["dp", "fsdp"] if lay.dp > 1 else setup.mesh["fsdp"]
    policy = mixed_precision(setup.autocast_dtype)
    distinct = list({id(b): b for b in blocks(setup.raw_model)}.values())
    for block in distinct:
        fully_shard(block, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward, mp_policy=policy)
    # the root keeps its parameters gathered after forward (torch's default for it): backward needs them first.
    # On a pipeline rank each chunk its schedule calls is a root, whose micro-batches' gradients the schedule
    # then accumulates unsharded and reduce-scatters once, after the last backward (torch.distributed.pipelining)
    for root in setup.pipeline.modules if setup.pipeline is not None else [setup.raw_model]:
        fully_shard(root, mesh=mesh, mp_policy=policy)
    kind = ("replicas" if lay.fsdp == 1 else "HSDP") if lay.dp > 1 else (
        "ZeRO-3" if cfg.reshard_after_forward else "ZeRO-2-like")
    dtype = str(setup.autocast_dtype).removeprefix("torch.") if setup.autocast_dtype else "fp32"
    setup.note("fsdp", f"{kind}: {len(distinct)} blocks then the root sharded {lay.fsdp} ways"
                       + (f", replicated {lay.dp} ways" if lay.dp > 1 else "")
                       + f"; reshard_after_forward={cfg.reshard_after_forward}, params gathered in {dtype}, "
                         "gradients reduced in fp32")


# enabled wherever a mesh is: whether it wraps depends on the world size too (Layout.fsdp_wraps)
STAGE = Stage(name="fsdp", section="parallel", apply=apply_fsdp, enabled=lambda c: c.model_parallel > 1)
