"""Tensor parallelism's plan (Megatron-LM, Shoeybi et al. 2019): which weights a tp rank holds a slice of.

Attention: q, k and v are split colwise (by output rows, i.e. by heads), o rowwise (by input
columns), so each rank computes whole heads and one all-reduce joins their outputs. Splitting k and
v by heads as well keeps grouped-query attention's groups on one rank: with H query and KV key/value
heads, rank r holds query heads r*H/tp .. and key/value heads r*KV/tp .., and query head h reads
key/value head h // (H/KV) on the same rank, which is why tp must divide KV (a check of
optimizers.parallel). MLP: the gate and up projections colwise, down rowwise: one all-reduce more.
Norms, the embedding and lm_head stay whole on every tp rank (FSDP shards them). With
`sequence_parallel` (Korthikanti et al. 2022) the residual stream between the matmuls and the block
norms hold 1/tp of the sequence, and each all-reduce becomes a reduce-scatter and an all-gather.

The MLP's gate and up projections are one fused Linear (HF's layout); its rows are interleaved
before sharding (`interleave_gate_up`), so the weights a tp run holds are a permutation of a
one-process run's: a stage of `switches.parallel`, applied before activation checkpointing and
compile (torchtitan's order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from optimizers.base import SetupContext, Stage, TrainSetup, blocks
from optimizers.parallel import ParallelConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

SHARDED_DIM: dict[str, int] = {
    "self_attn.q_proj.weight": 0, "self_attn.q_proj.bias": 0,
    "self_attn.k_proj.weight": 0, "self_attn.k_proj.bias": 0,
    "self_attn.v_proj.weight": 0, "self_attn.v_proj.bias": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.gate_up_proj.weight": 0,  # gate and up each split, so a rank holds its slice of both
    "mlp.down_proj.weight": 1,
}
"""Block parameter name -> the dim tp splits (0 colwise, 1 rowwise); a name not here is whole."""

NORMS = ("input_layernorm", "post_attention_layernorm")
"""A block's norms: with sequence parallelism each tp rank normalizes 1/tp of the sequence."""

ALL_REDUCES_PER_BLOCK = 2
"""Activation all-reduces a block makes in forward (after o_proj and after down_proj), and as many
in backward (the gradients of the colwise inputs); with sequence parallelism each is an all-gather and
a reduce-scatter of the same payload."""


def sharded_dim(block_param: str) -> int | None:
    """The dim tp splits of a block's parameter (named relative to the block), or None when whole."""
    return SHARDED_DIM.get(block_param)


def interleave_gate_up(weight: torch.Tensor, tp: int) -> torch.Tensor:
    """Rows [gate; up] reordered as [gate_0; up_0; gate_1; up_1; ...], so that the r-th of tp equal
    row chunks holds rank r's slice of both and the MLP's `chunk(2)` of its local output stays
    (gate_r, up_r). Colwise sharding of the fused rows as they are would give one rank all of gate."""
    import torch

    gate, up = weight.chunk(2, dim=0)
    return torch.cat([part for pair in zip(gate.chunk(tp), up.chunk(tp), strict=True) for part in pair])


def deinterleave_gate_up(weight: torch.Tensor, tp: int) -> torch.Tensor:
    """The inverse of `interleave_gate_up`: rows [gate; up] again (a checkpoint's one-process form)."""
    import torch

    chunks = weight.chunk(2 * tp)
    return torch.cat([*chunks[0::2], *chunks[1::2]])


def _plan(sequence_parallel: bool) -> dict[str, Any]:
    """A block's parallelize plan (module path -> style)."""
    # imported when a run splits tensors: DTensor's modules cost about a second of every start
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    # the block input, one replicated DTensor for all the colwise matmuls that read it: its gradient is
    # then reduced once per module in backward, not once per matmul. With sequence parallelism the
    # residual stream and the norms hold 1/tp of the sequence: the input is all-gathered here, and
    # the rowwise outputs reduce-scattered back to sequence shards instead of all-reduced
    entering = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "self_attn": PrepareModuleInput(input_layouts=(entering, None, None, None),
                                        desired_input_layouts=(Replicate(), None, None, None), use_local_output=False),
        "mlp": PrepareModuleInput(input_layouts=(entering,), desired_input_layouts=(Replicate(),),
                                  use_local_output=False)}
    for name, dim in SHARDED_DIM.items():
        module = name.rsplit(".", 1)[0]
        plan[module] = ColwiseParallel() if dim == 0 else RowwiseParallel(output_layouts=entering)
    if sequence_parallel:
        plan.update({norm: SequenceParallel() for norm in NORMS})
    return plan


def _shard_the_sequence(layers: list[nn.Module], mesh: Any) -> None:
    """Sequence parallelism's two ends around consecutive blocks: the embedding's output (or a pipeline
    neighbour's), whole on every tp rank, is cut to this rank's sequence shard entering the first block,
    and the last block's shards are all-gathered on leaving it, so the final norm, lm_head, loss and the
    next pipeline stage see the whole sequence as without it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput, parallelize_module

    parallelize_module(layers[0], mesh, PrepareModuleInput(
        input_layouts=(Replicate(), None, None, None), desired_input_layouts=(Shard(1), None, None, None),
        use_local_output=True))
    parallelize_module(layers[-1], mesh, PrepareModuleOutput(output_layouts=Shard(1),
                                                             desired_output_layouts=Replicate()))


def apply_tensor_parallel(setup: TrainSetup, cfg: ParallelConfig, ctx: SetupContext) -> None:
    import torch
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = setup.mesh["tp"]
    plan = _plan(cfg.sequence_parallel)
    layers = blocks(setup.raw_model)
    for block in layers:
        with torch.no_grad():
            fused = block.mlp.gate_up_proj.weight
            fused.copy_(interleave_gate_up(fused, cfg.tp))
        parallelize_module(block, mesh, plan)
    if cfg.sequence_parallel:  # around each chunk a pipeline schedule calls, or the whole model
        for chunk in setup.pipeline.chunk_blocks if setup.pipeline is not None else [layers]:
            _shard_the_sequence(list(chunk), mesh)
    setup.note("tensor_parallel", f"{len(layers)} blocks split {cfg.tp} ways: q, k, v and gate/up colwise, o and "
                                  "down rowwise (whole heads per rank, key/value heads split alike); "
                                  + ("the residual stream and the block norms split along the sequence "
                                     "(all-gather before attention and the MLP, reduce-scatter after); "
                                     if cfg.sequence_parallel else "")
                                  + "embedding, final norm and lm_head whole")


STAGE = Stage(name="tensor_parallel", section="parallel", apply=apply_tensor_parallel, enabled=lambda c: c.tp > 1)
