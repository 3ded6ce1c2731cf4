"""The checkpoint switch: how often to save, how many to keep, where, and resume (000 ch.5; 004 4.4).

The trainer does the work (`reference_model.checkpoint`: write to a temp file, fsync, rename;
keep the last K; `weights_only` loads that fall back to the next older checkpoint when one is
damaged; `Trainer.save`/`_resume` restore model, optimizer, schedule, scaler, batch size, RNG and
the loader's position). This module records the policy in the setup and holds the facts
`recommend` ranks it by. Saves are synchronous on rank 0, so the step that saves stalls (the other
ranks wait at the next all-reduce; under fsdp, tp or pp they first send rank 0 their shards, and any
layout resumes any other's checkpoint: reference_model.layout_state); saving less often is what
relieves a checkpoint-I/O-bound run.
The source's 004 4.4 is about Flink's stream snapshots (every 5 s): nothing there carries over to
a training loop but the idea of periodic, consistent snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck


@dataclass
class CheckpointConfig(Section):
    KEY: ClassVar[str] = "switches.checkpoint"
    every: int = 0
    """Save every N optimizer steps (0 = never). Saves are atomic: write, fsync, rename."""
    keep: int = 3
    """Keep the last K checkpoints."""
    dir: str = ""
    """Where to save ('' = <run dir>/checkpoints)."""
    resume: bool = False
    """Continue from the newest good checkpoint in `dir`, exactly where it stopped."""

    def __post_init__(self) -> None:
        self.check_range("every", lo=0, hi=10**9)
        self.check_range("keep", lo=1, hi=10**6)


def apply_checkpointing(setup: TrainSetup, cfg: CheckpointConfig, ctx: SetupContext) -> None:
    saves = (f"save every {cfg.every} steps on rank 0, keep the last {cfg.keep}" if cfg.every
             else "no periodic saves")
    setup.note("checkpoint", f"{saves}; dir {cfg.dir or '<run dir>/checkpoints'}; "
                             f"resume {'from the newest good checkpoint' if cfg.resume else 'off'}")


OPTIMIZATION = Optimization(
    name="checkpoint", config=CheckpointConfig, apply=apply_checkpointing, enabled=lambda c: c != CheckpointConfig(),
    addresses=(Bottleneck.CHECKPOINT_BOUND,),
    effect="saving every N steps spends one save's time per N steps, so a larger N cuts the share of "
           "time spent writing checkpoints in proportion; resume turns a crash into the steps since "
           "the last save",
    cost="a save writes the weights and the optimizer state (AdamW: about 3x the fp32 weights) and "
         "fsyncs them while training waits",
    risk="a larger N loses more steps on a crash; keep=1 leaves no older checkpoint to fall back to",
    source="000 ch.5; 004 4.4",
    candidates=(
        Candidate(set={"switches.checkpoint.every": lambda every: every * 4}, applies=lambda c: c.every > 0,
                  effects=(Effect("checkpoint", "shrinks", 0.75, 0.75,
                                  basis="arithmetic: one save per 4x as many steps"),),
                  note="a crash loses up to 4x as many steps"),
    ))
