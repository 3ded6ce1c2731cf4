"""Pipeline parallelism (`torch.distributed.pipelining`; 004 4.2): a stage of `switches.parallel`.

The blocks are cut into pp consecutive groups, one per rank of the mesh's pp dim (the embedding
on the first, the final norm and lm_head on the last; the model protocol's `keep_stage` and
`stage_forward`). Each batch is split into `microbatches`; the schedule runs them through the
stages, sending activations forward and their gradients back (send/recv), and accumulates the
stage's gradients over the micro-batches, each scaled by 1/m so the step's gradient is the whole
batch's. GPipe runs every forward, then every backward (m micro-batches of activations held);
1F1B starts backward as soon as the last stage has a micro-batch (at most p held). Either way a
rank idles (p-1)/(m+p-1) of the step, the bubble, which more micro-batches shrink.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from optimizers.base import SetupContext, Stage, TrainSetup
from optimizers.parallel import ParallelConfig


class StageModule(nn.Module):
    """What a pipeline stage calls: the model's `stage_forward` (the parameters keep the model's names)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model.stage_forward(x)


def stage_loss(logits: Tensor, labels: Tensor) -> Tensor:
    # fp32 cross-entropy over aligned labels; -100 (torch's default ignore_index) is skipped
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


@dataclass
class PipelineRunner:
    """Runs one batch through the schedule on this rank and returns the batch's mean loss on every
    rank of the pipeline (the last stage computes it and broadcasts it)."""

    schedule: Any
    module: nn.Module
    """The stage's module, which the schedule calls once per micro-batch."""
    first: bool
    last: bool
    group: dist.ProcessGroup
    last_rank: int
    device: torch.device

    def __call__(self, input_ids: Tensor, labels: Tensor) -> Tensor:
        losses: list[Tensor] = []
        if self.first:
            self.schedule.step(input_ids, target=labels if self.last else None, losses=losses)
        elif self.last:
            self.schedule.step(target=labels, losses=losses)
        else:
            self.schedule.step()
        loss = torch.stack(losses).mean().detach() if self.last else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=self.last_rank, group=self.group)
        return loss


def apply_pipeline(setup: TrainSetup, cfg: ParallelConfig, ctx: SetupContext) -> None:
    mesh = setup.mesh["pp"]
    stage = mesh.get_local_rank()
    assert ctx.shape is not None  # apply_all reads it off the model
    per_stage = ctx.shape.num_layers // cfg.pp
    model = setup.raw_model
    model.keep_stage(stage * per_stage, (stage + 1) * per_stage)
    group = mesh.get_group()
    # imported when a pipeline is built: it loads torch._dynamo, about a second of every start otherwise
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    module = StageModule(model)
    pipe = PipelineStage(module, stage, cfg.pp, ctx.device, group=group)
    schedule_class = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cfg.schedule]
    schedule = schedule_class(pipe, n_microbatches=cfg.pipeline_microbatches, loss_fn=stage_loss)
    last_rank = dist.get_global_rank(group, cfg.pp - 1)
    setup.pipeline = PipelineRunner(schedule=schedule, module=module, first=stage == 0, last=stage == cfg.pp - 1,
                                    group=group, last_rank=last_rank, device=ctx.device)
    setup.grad_norm_group = group
    m = cfg.pipeline_microbatches
    setup.note("pipeline", f"stage {stage} of {cfg.pp}: blocks {stage * per_stage}..{(stage + 1) * per_stage - 1}, "
                           f"{cfg.schedule} over {m} micro-batches (bubble (p-1)/(m+p-1) = "
                           f"{(cfg.pp - 1) / (m + cfg.pp - 1):.0%}); forward and backward run inside the "
                           "schedule, timed as forward")


STAGE = Stage(name="pipeline", section="parallel", apply=apply_pipeline, enabled=lambda c: c.pp > 1)
