"""A torchrun worker for tests/test_switch_ddp.py: trains the tiny model once per scenario and writes
this rank's figures to OUT/rank<r>.json.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/ddp_worker.py OUT SCENARIOS

SCENARIOS is a JSON list of {"name", "switches", "steps", "batch_size", "record"} (record: whether the
comm hook is wrapped by the profiler's counters, as profile-run does); every scenario reuses the
one process group (launching torchrun costs seconds, a scenario a fraction of one). With
GLMPERF_TEST_DIE_RANK and GLMPERF_TEST_DIE_STEP set, that rank exits with code 3 when that step
starts, as a crashed worker would (with GLMPERF_TEST_HANG set it hangs instead).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from optimizers import SwitchesConfig
from optimizers.config import build_section
from profiler.instruments.comm import CommStats
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.context import dist_env, setup_context
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.trainer import Trainer


class Recorder(TrainerHook):
    """Collects what the profiler would: the loss and `stats.take_step()` of every step."""

    def __init__(self, rank: int, stats: CommStats | None) -> None:
        self.rank = rank
        self.stats = stats
        self.die_rank = int(os.environ.get("GLMPERF_TEST_DIE_RANK", -1))
        self.die_step = int(os.environ.get("GLMPERF_TEST_DIE_STEP", -1))
        self.steps: list[dict[str, Any]] = []

    def on_step_start(self, step: int) -> None:
        if self.rank == self.die_rank and step == self.die_step:
            if os.environ.get("GLMPERF_TEST_HANG"):
                time.sleep(3600)  # alive but silent: only the peers' collective timeout notices
            os._exit(3)

    def on_step_end(self, record: StepRecord) -> None:
        self.steps.append({"loss": float(record.loss), "micro_batches": record.micro_batches,
                           "comm": dict(self.stats.take_step()) if self.stats is not None else None})


def run(scenario: dict[str, Any], rank: int, work: Path) -> dict[str, Any]:
    stats = CommStats(torch.device("cpu")) if scenario["record"] else None
    recorder = Recorder(rank, stats)
    data_cfg = DataConfig(corpus=["synthetic"], seq_len=32)
    train_cfg = TrainConfig(batch_size=scenario["batch_size"], steps=scenario["steps"], device="cpu")
    trainer = Trainer(
        model_cfg=model_config("tiny"), data_cfg=data_cfg, train_cfg=train_cfg,
        switches=build_section(SwitchesConfig, scenario["switches"], "switches"), hooks=[recorder],
        run_dir=work / scenario["name"],
        ctx=setup_context(train_cfg, data_cfg, wrap_comm_hook=stats.wrap if stats is not None else None))
    trainer.fit()
    return {"wrapped": isinstance(trainer.setup.model, DistributedDataParallel),
            "notes": trainer.setup.notes, "steps": recorder.steps}


def main(out: Path, scenarios: list[dict[str, Any]]) -> None:
    rank, world = dist_env()
    with tempfile.TemporaryDirectory() as tmp:
        results = {s["name"]: run(s, rank, Path(tmp)) for s in scenarios}
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world_size": world, "results": results}))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
