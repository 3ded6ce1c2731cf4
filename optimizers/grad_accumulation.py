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

from dataclasses import dataclass
from typing import ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import Section
from optimizers.facts import Candidate, Effect, no_modelled_gain
from optimizers.vocabulary import Bottleneck


@dataclass
class GradAccumulationConfig(Section):
    KEY: ClassVar[str] = "switches.grad_accumulation"
    steps: int = 1
    """Micro-batches per optimizer step (each of train.batch_size); 1 = no accumulation."""

    def __post_init__(self) -> None:
        self.check_range("steps", lo=1, hi=2**16)


def apply_grad_accumulation(setup: TrainSetup, cfg: GradAccumulationConfig, ctx: SetupContext) -> None:
    setup.accumulation_steps = cfg.steps
    sync = "all-reduce on the last only (no_sync)" if setup.no_sync is not None else "one optimizer step"
    setup.note("grad_accumulation",
               f"{cfg.steps} micro-batches of {ctx.batch_size} per step ({cfg.steps * ctx.batch_size} "
               f"samples per rank), {sync}")


_ONCE_PER_STEP = "arithmetic: paid once per optimizer step, which now carries 4x the tokens"
_LARGER = ("measured, not modelled: full checkpointing recomputes the forward (about +33% of the compute) while "
           "twice the micro-batch may fill the device better; no model predicts which wins")

OPTIMIZATION = Optimization(
    name="grad_accumulation",
    config=GradAccumulationConfig,
    apply=apply_grad_accumulation,
    enabled=lambda c: c.steps > 1,
    addresses=(Bottleneck.MEMORY_BOUND, Bottleneck.COMM_BOUND, Bottleneck.OPTIMIZER_BOUND),
    effect="the effective batch grows N-fold at the activation memory of one micro-batch; the optimizer "
           "step and (with DDP) the gradient all-reduce are paid once per N micro-batches",
    cost="N sequential micro-batches: no faster per sample on a device that a bigger micro-batch "
         "would fill better",
    risk="a larger effective batch changes the optimization (retune lr and warmup); micro-batches with "
         "unequal labelled-token counts are weighted equally, not per token",
    source="000 4.3; 004 3.2",
    candidates=(
        # the same micro-batch, 4x the tokens per optimizer step: the step's fixed costs per token fall
        Candidate(set={"switches.grad_accumulation.steps": lambda steps: steps * 4}, risk="convergence",
                  effects=(Effect("optimizer", "shrinks", 0.75, 0.75, basis=_ONCE_PER_STEP),
                           Effect("comm", "shrinks", 0.75, 0.75, basis=_ONCE_PER_STEP + " (no_sync before)"),
                           Effect("comm_bytes", "shrinks", 0.75, 0.75, basis=_ONCE_PER_STEP)),
                  note="a 4x larger effective batch: retune lr and warmup"),
        # the same global batch in a quarter of the activation memory
        Candidate(set={"switches.grad_accumulation.steps": lambda steps: steps * 4,
                       "train.batch_size": lambda batch: max(1, batch // 4)},
                  effects=(Effect("peak_memory", "shrinks", 0.5, 0.6,
                                  basis="grad_accumulation=4, batch 2 row: total -59%, saved activations -75%"),
                           Effect("forward", "grows", 0.1, 0.3,
                                  basis="grad_accumulation=4, batch 2 row: forward 119 -> 144 ms (+21%)"),
                           Effect("backward", "grows", 0.05, 0.2,
                                  basis="grad_accumulation=4, batch 2 row: backward 239 -> 268 ms (+12%)")),
                  note="smaller matmuls fill the device less well; the global batch stays the same from "
                       "train.batch_size >= 4"),
        # the same global batch in twice the micro-batch, its activations paid for by recomputing the forward
        Candidate(set={"switches.grad_accumulation.steps": lambda steps: max(1, steps // 2),
                       "train.batch_size": lambda batch: batch * 2,
                       "switches.activation_checkpointing.mode": "full"},
                  applies=lambda c: c.steps % 2 == 0, risk="numerics",
                  effects=no_modelled_gain(_LARGER),
                  note="larger matmuls against a recomputed forward: which wins depends on how well the device's "
                       "kernels fill at each size, so only a probe on the run's own model advises it"),
    ),
)
