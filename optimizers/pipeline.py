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

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from optimizers.base import SetupContext, Stage, TrainSetup
from optimizers.parallel import ParallelConfig

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
    from torch.distributed.pipelining.stage import _PipelineStageBase  # what torch's schedules take a list of


class Decoder(Protocol):
    """A staged model's decoder (`model.model`): the parts a stage registers; the embedding and the final
    norm are None on the stages that `keep_stage` left without them."""

    @property
    def layers(self) -> nn.ModuleList: ...
    @property
    def embed_tokens(self) -> nn.Module | None: ...
    @property
    def norm(self) -> nn.Module | None: ...


class StagedModel(Protocol):
    """The model protocol's pipeline part, beside `blocks` (reference_model.model.GLMForCausalLM has it):
    the decoder's parts and lm_head by their HF names, `keep_stage` and `stage_forward`."""

    @property
    def model(self) -> Decoder: ...
    @property
    def lm_head(self) -> nn.Module | None: ...
    def keep_stage(self, numbers: list[int]) -> None: ...
    def stage_forward(self, x: Tensor, start: int = 0, stop: int | None = None) -> Tensor: ...


class StageModule(nn.Module):
    """What the schedule calls for one chunk of the rank's kept blocks, [start, stop): the model's
    `stage_forward` over them. It registers only the chunk's parameters (its blocks, the embedding where
    it begins the model, the final norm and lm_head where it ends it), since the schedule scales each
    chunk's gradients by 1/m and FSDP shards each chunk as a root."""

    def __init__(self, model: StagedModel, start: int, stop: int) -> None:
        super().__init__()
        inner = model.model
        self.layers = nn.ModuleList(inner.layers[start:stop])
        self.embed_tokens = inner.embed_tokens if start == 0 else None
        ends = stop == len(inner.layers)
        self.norm: nn.Module | None = inner.norm if ends else None
        self.lm_head: nn.Module | None = model.lm_head if ends else None
        self._forward = partial(model.stage_forward, start=start, stop=stop)

    def forward(self, x: Tensor) -> Tensor:
        return self._forward(x)


def stage_blocks(stage: int, cfg: ParallelConfig, num_layers: int) -> list[list[int]]:
    """The model's numbers of the blocks pipeline rank `stage` runs, chunk by chunk: one chunk of
    consecutive blocks, or v of them under interleaved 1F1B (chunks stage, stage + pp, ...)."""
    chunks = cfg.pp * cfg.chunks_per_rank
    size = num_layers // chunks
    return [list(range(c * size, (c + 1) * size)) for c in range(stage, chunks, cfg.pp)]


def stage_loss(logits: Tensor, labels: Tensor) -> Tensor:
    # fp32 cross-entropy over aligned labels; -100 (torch's default ignore_index) is skipped
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


@dataclass
class PipelineRunner:
    """Runs one batch through the schedule on this rank and returns the batch's mean loss on every
    rank of the pipeline (the last stage computes it and broadcasts it)."""

    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    modules: list[StageModule]
    """The rank's chunks (one unless interleaved), which the schedule calls once per micro-batch each."""
    blocks: list[int]
    """The model's numbers of the rank's kept blocks 0, 1, ... (checkpoints are saved under these)."""
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

    @property
    def chunk_blocks(self) -> list[nn.ModuleList]:
        """Each chunk's blocks, in order."""
        return [module.layers for module in self.modules]


def apply_pipeline(setup: TrainSetup, cfg: ParallelConfig, ctx: SetupContext) -> None:
    mesh = setup.mesh["pp"]
    stage = mesh.get_local_rank()
    assert ctx.shape is not None  # apply_all reads it off the model
    chunks = stage_blocks(stage, cfg, ctx.shape.num_layers)
    model = cast(StagedModel, setup.raw_model)  # the model protocol's pipeline part, which a pipeline needs
    kept = [n for chunk in chunks for n in chunk]
    model.keep_stage(kept)
    group = mesh.get_group()
    # imported when a pipeline is built: it loads torch._dynamo, about a second of every start otherwise
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

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
