"""Pipeline parallelism (`torch.distributed.pipelining`; 004 4.2): a stage of `switches.parallel`.

The blocks are cut into pp consecutive groups, one per rank of the mesh's pp dim (the embedding
on the first, the final norm and lm_head on the last; the model protocol's `keep_stage` and
`stage_forward`). Each batch is split into `microbatches`; the schedule runs them through the
stages, sending activations forward and their gradients back (send/recv), and accumulates the
stage's gradients over the micro-batches, each scaled by 1/m so the step's gradient is the whole
batch's. GPipe runs every forward, then every backward (m micro-batches of activations held);
1F1B starts backward as soon as the last stage has a micro-batch (at most p held). Either way a
rank idles (p-1)/(m+p-1) of the step, the bubble, which more micro-batches shrink. Interleaved
1F1B cuts the blocks into pp x v chunks instead, rank s running chunks s, s+p, ...: a micro-batch
passes every rank v times, the bubble shrinks to (p-1)/(v*m+p-1), and sends multiply by v.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from optimizers.base import SetupContext, Stage, TrainSetup
from optimizers.parallel import ParallelConfig

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
    from torch.distributed.pipelining.stage import _PipelineStageBase  # what torch's schedules take a list of

    from optimizers.pipeline_schedule import StagedModel


def stage_blocks(stage: int, cfg: ParallelConfig, num_layers: int) -> list[list[int]]:
    """The model's numbers of the blocks pipeline rank `stage` runs, chunk by chunk: one chunk of
    consecutive blocks, or v of them under interleaved 1F1B (chunks stage, stage + pp, ...)."""
    chunks = cfg.pp * cfg.chunks_per_rank
    size = num_layers // chunks
    return [list(range(c * size, (c + 1) * size)) for c in range(stage, chunks, cfg.pp)]


def apply_pipeline(setup: TrainSetup, cfg: ParallelConfig, ctx: SetupContext) -> None:
    mesh = setup.mesh["pp"]
    stage = mesh.get_local_rank()
    assert ctx.shape is not None  # apply_all reads it off the model
    chunks = stage_blocks(stage, cfg, ctx.shape.num_layers)
    model = cast("StagedModel", setup.raw_model)  # the model protocol's pipeline part, which a pipeline needs
    kept = [n for chunk in chunks for n in chunk]
    model.keep_stage(kept)
    group = mesh.get_group()
    # imported when a pipeline is built: it loads torch._dynamo, about a second of every start otherwise
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    from optimizers.pipeline_schedule import PipelineRunner, StageModule, stage_loss

    size, count = len(chunks[0]), cfg.pp * len(chunks)
    modules = [StageModule(model, i * size, (i + 1) * size) for i in range(len(chunks))]
    stages: list[_PipelineStageBase] = [PipelineStage(module, stage + i * cfg.pp, count, ctx.device, group=group)
                                        for i, module in enumerate(modules)]
    m = cfg.pipeline_microbatches
    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    if cfg.schedule == "interleaved_1f1b":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=stage_loss)
    else:
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cfg.schedule](
            stages[0], n_microbatches=m, loss_fn=stage_loss)
    last_rank = dist.get_global_rank(group, cfg.pp - 1)
    setup.pipeline = PipelineRunner(schedule=schedule, modules=modules, blocks=kept, first=stage == 0,
                                    last=stage == cfg.pp - 1, group=group, last_rank=last_rank, device=ctx.device)
    setup.grad_norm_group = group
    v = len(chunks)
    held = ", ".join(f"{chunk[0]}..{chunk[-1]}" for chunk in chunks)
    bubble = f"(p-1)/({'v*' if v > 1 else ''}m+p-1) = {(cfg.pp - 1) / (v * m + cfg.pp - 1):.0%}"
    setup.note("pipeline", f"stage {stage} of {cfg.pp}: blocks {held}, {cfg.schedule} over {m} micro-batches "
                           f"(bubble {bubble}); forward and backward run inside the schedule, timed as forward")


STAGE = Stage(name="pipeline", section="parallel", apply=apply_pipeline, enabled=lambda c: c.pp > 1)
