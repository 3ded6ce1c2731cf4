"""A torchrun worker for tests/test_switch_parallel.py: trains a preset's model once per scenario and
writes this rank's losses and held bytes to OUT/rank<r>.json.

    python -m torch.distributed.run --standalone --nproc_per_node=N tests/parallel_worker.py OUT SCENARIOS

SCENARIOS is a JSON list of {"name", "preset", "switches", "steps", "batch_size"}. Per scenario a rank reports
its step losses, the bytes of parameters, gradients and optimizer state it holds after training
(`Trainer.held_bytes`), and the bytes one forward saves for backward (`profiler.advice.saved_tensors.forward_saved`,
the count `glmperf plan` traces); a pipeline stage, the peak of what its schedule keeps alive over one
batch (every micro-batch in flight, and each one's output). Every scenario reuses one process group.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from optimizers import SwitchesConfig
from optimizers.config import build_section
from optimizers.pipeline_schedule import PipelineRunner
from profiler.advice.saved_tensors import SavedTracker, forward_saved
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.trainer import Trainer

SEQ_LEN = 32


class Losses(TrainerHook):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_step_end(self, record: StepRecord) -> None:
        self.values.append(float(record.loss))


def pipeline_peak(pipeline: PipelineRunner, ids: torch.Tensor, dtype: torch.dtype | None) -> tuple[int, int]:
    """The most bytes of saved tensors and kept outputs alive at once while the schedule runs one batch,
    and of the weight copies autocast saved."""
    with SavedTracker(nn.ModuleList(pipeline.modules)) as tracker, \
            torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        handles = [m.register_forward_hook(lambda _module, _args, out: tracker.hold(out)) for m in pipeline.modules]
        pipeline(ids, ids)
        for handle in handles:
            handle.remove()
    return tracker.peak, sum(tracker.copies.values())


def run(scenario: dict[str, Any]) -> dict[str, Any]:
    losses = Losses()
    trainer = Trainer(model_cfg=model_config(scenario["preset"]),
                      data_cfg=DataConfig(corpus=["synthetic"], seq_len=SEQ_LEN),
                      train_cfg=TrainConfig(batch_size=scenario["batch_size"], steps=scenario["steps"], device="cpu"),
                      switches=build_section(SwitchesConfig, scenario["switches"], "switches"), hooks=[losses])
    trainer.fit()
    held = trainer.held_bytes()  # before the measuring forward, which leaves FSDP's root gathered
    ids = torch.zeros(scenario["batch_size"], SEQ_LEN, dtype=torch.long)
    setup = trainer.setup
    if setup.pipeline is None:
        activations, copies = forward_saved(setup.model, ids, setup.autocast_dtype)
    else:
        activations, copies = pipeline_peak(setup.pipeline, ids, setup.autocast_dtype)
    return {"losses": losses.values, "held": held, "activations": activations, "weight_copies": copies,
            "notes": setup.notes}


def main() -> None:
    out, scenarios = Path(sys.argv[1]), json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    results = {s["name"]: run(s) for s in scenarios}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps({"results": results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
