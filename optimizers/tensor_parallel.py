"""Tensor parallelism's plan (Megatron-LM, Shoeybi et al. 2019): which weights a tp rank holds a slice of.

Attention: q, k and v are split colwise (by output rows, i.e. by heads), o rowwise (by input
columns), so each rank computes whole heads and one all-reduce joins their outputs. Splitting k and
v by heads as well keeps grouped-query attention's groups on one rank: with H query and KV key/value
heads, rank r holds query heads r*H/tp .. and key/value heads r*KV/tp .., and query head h reads
key/value head h // (H/KV) on the same rank, which is why tp must divide KV (a check of
optimizers.parallel). MLP: the gate and up projections colwise, down rowwise: one all-reduce more.
Norms, the embedding and lm_head stay whole on every tp rank (FSDP shards them).
"""

from __future__ import annotations

SHARDED_DIM: dict[str, int] = {
    "self_attn.q_proj.weight": 0, "self_attn.q_proj.bias": 0,
    "self_attn.k_proj.weight": 0, "self_attn.k_proj.bias": 0,
    "self_attn.v_proj.weight": 0, "self_attn.v_proj.bias": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.gate_up_proj.weight": 0,  # gate and up each split, so a rank holds its slice of both
    "mlp.down_proj.weight": 1,
}
"""Block parameter name -> the dim tp splits (0 colwise, 1 rowwise); a name not here is whole."""

ALL_REDUCES_PER_BLOCK = 2
"""Activation all-reduces a block makes in forward (after o_proj and after down_proj), and as many
in backward (the gradients of the colwise inputs)."""


def sharded_dim(block_param: str) -> int | None:
    """The dim tp splits of a block's parameter (named relative to the block), or None when whole."""
    return SHARDED_DIM.get(block_param)
