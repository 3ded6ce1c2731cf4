"""The checkpoint switch: how often to save, how many to keep, where, and resume (000 ch.5; 004 4.4).

The trainer does the work (`reference_model.checkpoint`: write to a temp file, fsync, rename;
keep the last K; `weights_only` loads that fall back to the next older checkpoint when one is
damaged; `Trainer.save`/`_resume` restore model, optimizer, schedule, scaler, batch size, RNG and
the loader's position). This module records the policy in the setup and holds the facts
`recommend` ranks it by. Saves are synchronous on rank 0, so the step that saves stalls (the other
ranks wait at the next all-reduce); saving less often is what relieves a checkpoint-I/O-bound run.
The source's 004 4.4 is about Flink's stream snapshots (every 5 s): nothing there carries over to
a training loop but the idea of periodic, consistent snapshots.
"""

from __future__ import annotations

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import CheckpointConfig


def apply_checkpointing(setup: TrainSetup, cfg: CheckpointConfig, ctx: SetupContext) -> None:
    saves = (f"save every {cfg.every} steps on rank 0, keep the last {cfg.keep}" if cfg.every
             else "no periodic saves")
    setup.note("checkpoint", f"{saves}; dir {cfg.dir or '<run dir>/checkpoints'}; "
                             f"resume {'from the newest good checkpoint' if cfg.resume else 'off'}")


OPTIMIZATION = Optimization(
    name="checkpoint", apply=apply_checkpointing, enabled=lambda c: c != CheckpointConfig(),
    addresses=("checkpoint_io_bound",),
    effect="saving every N steps spends one save's time per N steps, so a larger N cuts the share of "
           "time spent writing checkpoints in proportion; resume turns a crash into the steps since "
           "the last save",
    cost="a save writes the weights and the optimizer state (AdamW: about 3x the fp32 weights) and "
         "fsyncs them while training waits",
    risk="a larger N loses more steps on a crash; keep=1 leaves no older checkpoint to fall back to",
    source="000 ch.5; 004 4.4")
