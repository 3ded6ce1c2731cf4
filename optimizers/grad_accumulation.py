"""Gradient accumulation: N micro-batches per optimizer step, a big batch in little memory (000 4.3; 004 3.2).

The trainer runs `accumulation_steps` forward/backward passes, each loss divided by that count,
and steps the optimizer once; under DDP every micro-batch but the last runs in `no_sync`, so
gradients are all-reduced once per step, not once per micro-batch (the source documents'
snippets leave this out, and pay the all-reduce N times).

Dividing by the count makes the accumulated gradient the mean of the micro-batches' mean losses.
That equals the gradient of one big batch only when every micro-batch has the same number of
labelled tokens: true for causal windows of fixed length, not for blank infilling, whose masked
token count varies per sample (then each micro-batch's tokens weigh a little differently).
"""

from __future__ import annotations

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import GradAccumulationConfig


def apply_grad_accumulation(setup: TrainSetup, cfg: GradAccumulationConfig, ctx: SetupContext) -> None:
    setup.accumulation_steps = cfg.steps
    sync = "all-reduce on the last only (no_sync)" if setup.no_sync is not None else "one optimizer step"
    setup.note("grad_accumulation",
               f"{cfg.steps} micro-batches of {ctx.batch_size} per step ({cfg.steps * ctx.batch_size} "
               f"samples per rank), {sync}")


OPTIMIZATION = Optimization(
    name="grad_accumulation",
    apply=apply_grad_accumulation,
    enabled=lambda c: c.steps > 1,
    addresses=("memory_bound", "communication_bound", "optimizer_bound"),
    effect="the effective batch grows N-fold at the activation memory of one micro-batch; the optimizer "
           "step and (with DDP) the gradient all-reduce are paid once per N micro-batches",
    cost="N sequential micro-batches: no faster per sample on a device that a bigger micro-batch "
         "would fill better",
    risk="a larger effective batch changes the optimization (retune lr and warmup); micro-batches with "
         "unequal labelled-token counts are weighted equally, not per token",
    source="000 4.3; 004 3.2",
)
