"""What a pipeline stage runs (optimizers.pipeline builds it): the model's blocks cut into stage modules, the
schedule that runs a batch through them, and the loss the last stage computes. Apart from the stage's facts so
that reading the catalog needs no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle


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
