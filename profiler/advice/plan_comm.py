"""The communication half of `glmperf plan`: payload bytes per optimizer step, by collective.

Payload as the traces count it (profiler.traces.collectives): the full tensor an all-gather produces,
a reduce-scatter or all-reduce consumes; send/recv what a rank sends and receives. On a ring each rank
moves (n-1)/n of an all-gather's or reduce-scatter's payload and 2(n-1)/n of an all-reduce's. FSDP
gathers and scatters per unit, tensor parallelism reduces twice per block and pass (and gathers under
sequence parallelism), a pipeline sends the residual stream across each stage boundary.
"""

from __future__ import annotations

import math

from optimizers.parallel import Layout, ParallelConfig
from optimizers.tensor_parallel import ALL_REDUCES_PER_BLOCK
from profiler.config import RunConfig


def comm_bytes(cfg: RunConfig, lay: Layout, par: ParallelConfig, *, gathered_stage: tuple[int, int], grads_held: int,
          micro: int, m: int, accumulation: int, stage_layers: int, compute: int, gather_bytes: int) -> dict[str, int]:
    """Payload bytes per optimizer step by collective, on the busiest rank: its stage's `gathered_stage`
    (FSDP units' elements: blocks, root), `grads_held` gradient elements, `micro`-sample micro-batches,
    `m` of them per pipeline pass, `compute` and `gather_bytes` the bytes of an element computed and gathered."""
    blocks, root = gathered_stage
    passes = accumulation * m  # forward/backward passes per optimizer step
    comm = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0, "send_recv": 0}
    if lay.fsdp_wraps:
        # a pipeline stage accumulates its micro-batches' gradients unsharded and reduce-scatters once
        # (torch.distributed.pipelining); with resharding a block is gathered by each forward and once in
        # backward (traced: m + 1 under GPipe, 1F1B and interleaved alike), the root once. Shards of one
        # rank (replicas of a tp or pp model) gather and scatter nothing
        reductions = accumulation if lay.pp > 1 else passes
        if lay.pp > 1:
            gathers = accumulation * (blocks * (m + 1 if par.reshard_after_forward else 1) + root)
        else:
            regather = blocks if par.reshard_after_forward else 0  # backward gathers resharded blocks again
            gathers = passes * (blocks + root + regather)
        sharded = lay.fsdp > 1
        comm["all_gather"] = gather_bytes * gathers * sharded
        comm["reduce_scatter"] = reductions * 4 * (blocks + root) * sharded
        if lay.dp > 1:
            comm["all_reduce"] += reductions * 4 * grads_held
    elif lay.dp > 1:
        comm["all_reduce"] += 4 * grads_held  # once per step: accumulation runs no_sync before the last
    if lay.tp > 1:
        comm_tp = tensor_parallel_comm(cfg, micro=micro, stage_layers=stage_layers, compute=compute)
        for kind, payload in comm_tp.items():
            comm[kind] += passes * payload
    if lay.pp > 1:
        # the residual stream crosses a boundary: fp32 under autocast, FSDP's gathered dtype under FSDP
        boundary = micro * cfg.data.seq_len * cfg.model.hidden_size * (gather_bytes if lay.fsdp_wraps else 4)
        # each chunk receives its input and sends its output, but the model's first input and last output
        chunks = par.chunks_per_rank
        sides = 2 * chunks - 1 if lay.pp == 2 else 2 * chunks  # the busiest rank: a middle one from 3 stages
        comm["send_recv"] = accumulation * m * 2 * sides * boundary  # activations forward, gradients back
    comm["total"] = sum(comm.values())
    return comm


def tensor_parallel_comm(cfg: RunConfig, *, micro: int, stage_layers: int, compute: int) -> dict[str, int]:
    """Payload bytes of one forward and backward's tensor-parallel collectives, by kind.

    Per block and pass, twice (attention, MLP): forward reduces a rowwise matmul's output (the compute
    dtype), backward the gradient of the colwise matmuls' input (the norm's output: fp32, the residual
    stream's dtype). A checkpointed block's recompute stops once backward has what it saved (torch's
    non-reentrant checkpoint stops early), the MLP's input: the attention's output is reduced again, not
    the MLP's. Without sequence parallelism each reduction is an all-reduce; with it a reduce-scatter,
    and an all-gather precedes the colwise matmuls in forward and recompute (fp32) and the rowwise
    output's gradient in backward (compute dtype), plus the sequence's two ends: the last block's output
    gathered in forward, the first block's input gradient in backward."""
    tokens = micro * cfg.data.seq_len * cfg.model.hidden_size
    ac = cfg.switches.activation_checkpointing
    recomputed = {"off": 0, "full": stage_layers}.get(ac.mode, math.ceil(stage_layers / ac.every))
    reduced = (stage_layers * ALL_REDUCES_PER_BLOCK * (compute + 4) + recomputed * compute) * tokens
    if not cfg.switches.parallel.sequence_parallel:
        return {"all_reduce": reduced}
    gathered = (stage_layers * ALL_REDUCES_PER_BLOCK * (4 + compute) + recomputed * ALL_REDUCES_PER_BLOCK * 4
                + 2 * 4) * tokens
    return {"reduce_scatter": reduced, "all_gather": gathered}
