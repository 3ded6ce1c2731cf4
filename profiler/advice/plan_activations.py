"""The activation half of `glmperf plan`: what autograd saves per micro-batch, traced at shapes only.

The real model's forward runs under FakeTensorMode (no memory, as torchtitan's memory estimator does)
at a rank's local shapes: tensor parallelism's head counts and MLP width, 1- and 2-block models for
one block's saves, a pipeline's first and last stage. The distinct storages autograd saves for
backward are counted as a run measures them (profiler.advice.saved_tensors); `activation_bytes`
scales them by the blocks a rank holds, the micro-batches its schedule keeps in flight, and
checkpointing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from optimizers.parallel import ParallelConfig
from optimizers.pipeline_schedule import stage_loss
from optimizers.tensor_parallel import NORMS
from profiler.advice.saved_tensors import SavedTracker, forward_saved
from profiler.config import RunConfig
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM


@dataclass(frozen=True)
class ActivationTrace:
    """Saved bytes per micro-batch at a rank's shapes: one block, and what else each kind of rank keeps."""

    block: int
    block_input: int
    """The residual stream entering a block (what a checkpointed block keeps)."""
    rest: int
    """A whole model's beyond its blocks: the embedding's, the final norm's, lm_head's, the loss's, the logits."""
    stage_rest: tuple[int, int, int] = (0, 0, 0)
    """A pipeline's first, middle and last stage beyond their blocks: the embedding's saves or the norm's,
    lm_head's and loss's, plus the output each stage keeps for its backward (hidden states, or logits)."""
    logits: int = 0
    """One micro-batch's logits as the last stage outputs them: torch's schedules keep every micro-batch's
    until the step ends (to return them merged), after its activations are freed."""


def _shaped(cfg: RunConfig, tp: int, layers: int) -> GLMForCausalLM:
    """The model with `layers` blocks at a tp rank's local head counts and MLP width."""
    m = cfg.model
    fields = {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name != "preset"}
    shape = dict(num_attention_heads=m.num_attention_heads // tp, num_key_value_heads=m.num_key_value_heads // tp,
                 intermediate_size=m.intermediate_size // tp, num_hidden_layers=layers)
    return GLMForCausalLM(model_config(m.preset, **{**fields, **shape}))


def _norms(model: GLMForCausalLM) -> list[nn.Module]:
    """The block norms, which sequence parallelism runs on 1/tp of the sequence."""
    return [getattr(block, name) for block in model.blocks for name in NORMS]


def _stage_saved(cfg: RunConfig, tp: int, ways: int, micro_batch: int, dtype: torch.dtype | None, *,
                 first: bool) -> tuple[int, int]:
    """Saved bytes of a one-block pipeline stage (the first or the last of two) with its kept output,
    and that output's bytes."""
    model = _shaped(cfg, tp, layers=2)
    model.keep_stage([0] if first else [1])
    shape = (micro_batch, cfg.data.seq_len) + (() if first else (cfg.model.hidden_size,))
    x = torch.zeros(shape, dtype=torch.long) if first else torch.zeros(shape, requires_grad=True)
    with SavedTracker(model) as tracker, torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        tracker.split_inside(_norms(model), ways)
        out = model.stage_forward(x)
        if not first:
            stage_loss(out, torch.zeros(shape[:2], dtype=torch.long))
    tracker.hold(out)
    return tracker.current, out.untyped_storage().nbytes()


def trace_activations(cfg: RunConfig, *, tp: int, micro_batch: int, stages: bool = False) -> ActivationTrace:
    """Trace 1- and 2-block models with tp's local head counts and MLP width under FakeTensorMode,
    and with `stages` a pipeline's first and last stage of one block each. With sequence parallelism
    what the block norms save, and the residual stream a checkpointed block keeps, is 1/tp."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.switches.amp.dtype)
    ways = tp if cfg.switches.parallel.sequence_parallel else 1
    hidden = micro_batch * cfg.data.seq_len * cfg.model.hidden_size * 4  # the fp32 residual stream
    with FakeTensorMode():
        ids = torch.zeros(micro_batch, cfg.data.seq_len, dtype=torch.long)
        one, two = (forward_saved(model, ids, dtype, split=(_norms(model), ways))[0]
                    for model in (_shaped(cfg, tp, layers) for layers in (1, 2)))
        block = two - one
        if not stages:
            return ActivationTrace(block=block, block_input=hidden // ways, rest=one - block)
        first, output = _stage_saved(cfg, tp, ways, micro_batch, dtype, first=True)
        last, logits = _stage_saved(cfg, tp, ways, micro_batch, dtype, first=False)
    return ActivationTrace(block=block, block_input=hidden // ways, rest=one - block,
                           stage_rest=(first - block, output, last - block), logits=logits)


def micro_batches_in_flight(par: ParallelConfig, pp: int, m: int, stage: int) -> float:
    """Micro-batches of a stage's activations alive at its peak: GPipe runs every forward first (m); 1F1B
    warms up with p-1-s forwards and starts each backward after one more (p-s, at most m); interleaved
    1F1B warms up with (v-1)p + 2(p-1-s) chunk forwards, each of 1/v of the stage's blocks (torch's
    schedules)."""
    if pp == 1:
        return 1
    if par.schedule == "gpipe":
        return m
    if par.schedule == "1f1b":
        return min(m, pp - stage)
    v = par.virtual_stages
    return min(v * m, (v - 1) * pp + 2 * (pp - 1 - stage) + 1) / v


def activation_bytes(trace: ActivationTrace, layers: int, mode: str, *, every: int, extra: int,
                     in_flight: float) -> int:
    """A rank's activation bytes: per micro-batch in flight, its blocks' saved storages (only the input of
    a checkpointed block) and `extra` (what the rank keeps beyond its blocks); backward recomputes one
    checkpointed block at a time, after the blocks above it have freed theirs, so with every block
    checkpointed the peak adds that one block's."""
    checkpointed = 0 if mode == "off" else layers if mode == "full" else math.ceil(layers / every)
    kept = layers - checkpointed
    per_micro_batch = extra + checkpointed * trace.block_input + kept * trace.block
    return round(in_flight * per_micro_batch) + (trace.block if kept == 0 else 0)
