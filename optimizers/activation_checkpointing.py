"""Activation checkpointing: blocks keep only their inputs and recompute the rest in backward (000 2.3).

A block's `forward` is replaced by one that runs the original under
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`. The module tree is untouched, so
state-dict keys, HF conversion and parameter counts stay exactly as without the switch (torch's
`checkpoint_wrapper` would insert a `_checkpoint_wrapped_module.` level into every key).

The source document's snippet has two bugs worth naming: it keeps its blocks in a plain list (so
`model.parameters()` misses them and nothing trains), and it calls `checkpoint(block, x)` with the
reentrant default (still the default in torch 2.13, with a warning), under which a block whose
input does not require grad returns an output without grad: its parameters get no gradients.
Non-reentrant checkpointing has neither problem and composes with autocast, torch.compile and DDP.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup, blocks
from optimizers.config import Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck

if TYPE_CHECKING:
    from torch import nn


@dataclass
class ActivationCheckpointingConfig(Section):
    KEY: ClassVar[str] = "switches.activation_checkpointing"
    mode: str = "off"
    """off; full (every block recomputes its activations in backward); selective (every Nth)."""
    every: int = 2
    """selective only: checkpoint blocks 0, N, 2N, ..."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "full", "selective"])
        self.check_range("every", lo=1, hi=1024)


def is_checkpointed(block: nn.Module) -> bool:
    from torch.utils.checkpoint import checkpoint

    forward = block.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is checkpoint


def checkpoint_block(block: nn.Module) -> None:
    """Make `block` recompute its activations in backward; idempotent.

    A `functools.partial` of torch's `checkpoint` over the bound method (not a closure) so that
    `copy.deepcopy` rebinds it to the copy and pickling works. preserve_rng_state (the default) replays
    dropout masks exactly in the recompute.
    """
    from torch.utils.checkpoint import checkpoint

    if not is_checkpointed(block):
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def chosen_blocks(layers: nn.ModuleList, mode: str, every: int) -> list[nn.Module]:
    """The distinct block instances to checkpoint: all (full) or those at positions 0, N, 2N (selective).

    A block shared by several positions (parameter sharing) is one instance, so it is checkpointed
    wherever it runs once any of its positions is chosen.
    """

    chosen: dict[int, nn.Module] = {}
    for position, block in enumerate(layers):
        if mode == "full" or position % every == 0:
            chosen.setdefault(id(block), block)
    return list(chosen.values())


def apply_activation_checkpointing(setup: TrainSetup, cfg: ActivationCheckpointingConfig,
                                   ctx: SetupContext) -> None:
    layers = blocks(setup.raw_model)
    if cfg.mode == "off":
        setup.note("activation_checkpointing", "off")
        return
    chosen = chosen_blocks(layers, cfg.mode, cfg.every)
    for block in chosen:
        checkpoint_block(block)
    ids = {id(b) for b in chosen}
    positions = [i for i, block in enumerate(layers) if id(block) in ids]
    setup.note("activation_checkpointing",
               f"{cfg.mode}: blocks at positions {', '.join(map(str, positions))} of {len(layers)} "
               f"({len(chosen)} distinct) recompute their activations in backward")


OPTIMIZATION = Optimization(
    name="activation_checkpointing",
    config=ActivationCheckpointingConfig,
    apply=apply_activation_checkpointing,
    enabled=lambda c: c.mode != "off",
    addresses=(Bottleneck.MEMORY_BOUND,),
    effect="a checkpointed block keeps only its input for backward instead of every intermediate, so "
           "activation memory drops roughly by the share of blocks checkpointed; the memory freed buys "
           "a larger batch or sequence",
    cost="one extra forward of each checkpointed block in backward (about +1/3 of the step's compute "
         "for full; the source documents claim +20-30% time and -60% memory)",
    risk="slower steps when memory was not the limit; selective trades less saving for less recompute",
    source="000 2.3; 004 2.5",
    candidates=(
        Candidate(set={"switches.activation_checkpointing.mode": "full"}, applies=lambda c: c.mode != "full",
                  effects=(Effect("peak_memory", "shrinks", 0.5, 0.75,
                                  basis="activation_checkpointing=full row: total -71%, saved activations -90% "
                                        "(a tensor count); the source claims -60%"),
                           Effect("backward", "grows", 0.3, 0.45,
                                  basis="activation_checkpointing=full row: backward 239 -> 340 ms (+42%), "
                                        "one more forward per block"))),
        Candidate(set={"switches.activation_checkpointing.mode": "selective",
                       "switches.activation_checkpointing.every": 2}, applies=lambda c: c.mode == "off",
                  effects=(Effect("peak_memory", "shrinks", 0.25, 0.4,
                                  basis="activation_checkpointing=selective (every 2) row: total -36%"),
                           Effect("backward", "grows", 0.15, 0.25,
                                  basis="activation_checkpointing=selective (every 2) row: backward 239 -> "
                                        "292 ms (+22%)"))),
    ),
)
