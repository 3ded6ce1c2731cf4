"""Model and optimizer state in one form for every layout: the one-process model's.

A checkpoint saved by fsdp, tp or pp ranks therefore resumes on any other layout, one process
included. The state goes through torch.distributed.checkpoint.state_dict: full state dicts keyed by
parameter names (FSDP and tensor-parallel shards gathered, wrapper prefixes dropped), the optimizer's
keyed by the same names. Two things a full state dict does not undo are undone here: tensor
parallelism's interleaved gate/up rows (optimizers.tensor_parallel), and a pipeline stage's block
numbering (a stage keeps its blocks as 0..k-1; they are saved under the model's numbers). Pipeline
stages send their parts to global rank 0, which writes the file; a load reads the whole file on every
rank and keeps its part. Rank 0 holds the whole model and optimizer state in CPU memory while saving.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from optimizers.base import TrainSetup
from optimizers.parallel import ParallelConfig
from optimizers.tensor_parallel import deinterleave_gate_up, interleave_gate_up

_BLOCK = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_GATE_UP = "mlp.gate_up_proj.weight"


@dataclass(frozen=True)
class StateLayout:
    """What a rank's state differs from the one-process model's by."""

    collective: bool = False
    """Whether saving is a collective of every rank (any layout but one process or plain DDP)."""
    tp: int = 1
    block_numbers: tuple[int, ...] = ()
    """The model's numbers of this rank's blocks 0, 1, ... (a pipeline stage's; none: the same numbers)."""
    pp_group: dist.ProcessGroup | None = None
    """The pipeline's group when the model is cut into stages: their parts are gathered on rank 0."""
    gathers: bool = True
    """Whether this rank sends its stage's part to rank 0: the pipeline of rank 0 does (its other
    coordinates are 0); the others' stages hold the same full state after the stage's own gathers."""


def state_layout(setup: TrainSetup, cfg: ParallelConfig) -> StateLayout:
    """The layout of this rank's state under `cfg` (set up in `setup`)."""
    if setup.mesh is None:
        return StateLayout()
    if setup.pipeline is None:
        return StateLayout(collective=True, tp=cfg.tp)
    leader = all(setup.mesh.get_local_rank(dim) == 0 for dim in ("dp", "fsdp", "tp"))
    return StateLayout(collective=True, tp=cfg.tp, block_numbers=tuple(setup.pipeline.blocks),
                       pp_group=setup.mesh["pp"].get_group(), gathers=leader)


def _renumber(names: dict[str, Any], numbers: dict[int, int]) -> dict[str, Any]:
    """`names` with block numbers mapped by `numbers`; a block missing from it is dropped (another stage's)."""
    out = {}
    for name, value in names.items():
        match = _BLOCK.match(name)
        if match is None:
            out[name] = value
        elif int(match.group(1)) in numbers:
            out[f"model.layers.{numbers[int(match.group(1))]}.{match.group(2)}"] = value
    return out


def _gate_up(model_sd: dict[str, Any], optim_sd: dict[str, Any], reorder: Any, tp: int) -> None:
    """Reorder the fused gate/up rows of every block weight and of its optimizer moments (same shape)."""
    for name in [n for n in model_sd if n.endswith(_GATE_UP)]:
        model_sd[name] = reorder(model_sd[name], tp)
        moments = optim_sd["state"].get(name, {})
        for key, moment in moments.items():
            if isinstance(moment, torch.Tensor) and moment.dim() == 2:
                moments[key] = reorder(moment, tp)


def _to_numbers(model_sd: dict[str, Any], optim_sd: dict[str, Any], numbers: dict[int, int]) -> dict[str, Any]:
    """The model's state renumbered (and the optimizer's in place): a stage's to the model's numbers, or the
    model's to the stage's, dropping the other stages' blocks."""
    optim_sd["state"] = _renumber(optim_sd["state"], numbers)
    for group in optim_sd["param_groups"]:
        group["params"] = list(_renumber(dict.fromkeys(group["params"]), numbers))
    return _renumber(model_sd, numbers)


def _merge_stages(parts: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One model's state from its stages' (names keyed, so their order does not matter on load)."""
    model_sd: dict[str, Any] = {}
    state: dict[str, Any] = {}
    groups = [dict(group, params=[]) for group in parts[0][1]["param_groups"]]
    for part_model, part_optim in parts:
        model_sd.update(part_model)
        state.update(part_optim["state"])
        for merged, group in zip(groups, part_optim["param_groups"], strict=True):
            merged["params"] += group["params"]
    return model_sd, {"state": state, "param_groups": groups}


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer,
               lay: StateLayout) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (model, optimizer) state in the one-process form on global rank 0, None elsewhere.

    A collective under a sharded layout: every rank of it must call this at the same step.
    """
    # imported on a save: it loads FSDP's modules, half a second of every start otherwise
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    # a pipeline stage's tensors are whole on their rank: gathered below, so no offload to rank 0 only
    options = StateDictOptions(full_state_dict=True, cpu_offload=lay.pp_group is None)
    # full state dicts: every value a whole tensor (torch types them as anything a state dict may hold)
    model_sd = cast("dict[str, torch.Tensor]", get_model_state_dict(model, options=options))
    optim_sd = cast("dict[str, Any]", get_optimizer_state_dict(model, optimizer, options=options))
    if lay.pp_group is not None:
        if not lay.gathers:
            return None
        model_sd = {name: t.detach().cpu() for name, t in model_sd.items()}
        optim_sd["state"] = {name: {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                             for name, s in optim_sd["state"].items()}
        model_sd = _to_numbers(model_sd, optim_sd, dict(enumerate(lay.block_numbers)))
        parts: list[Any] | None = [None] * dist.get_world_size(lay.pp_group) if dist.get_rank() == 0 else None
        dist.gather_object((model_sd, optim_sd), parts, dst=0, group=lay.pp_group)
        if parts is None:
            return None
        model_sd, optim_sd = _merge_stages(parts)
    elif dist.is_initialized() and dist.get_rank() != 0:
        return None
    if lay.tp > 1:
        _gate_up(model_sd, optim_sd, deinterleave_gate_up, lay.tp)
    return model_sd, optim_sd


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict[str, Any],
                    optim_sd: dict[str, Any], lay: StateLayout) -> None:
    """Load a one-process (model, optimizer) state into this rank's part of the model and optimizer."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if lay.pp_group is not None:  # keep this stage's blocks, renumbered as the stage holds them
        own = set(get_model_state_dict(model))
        model_sd = _to_numbers(model_sd, optim_sd, {n: i for i, n in enumerate(lay.block_numbers)})
        model_sd = {name: t for name, t in model_sd.items() if name in own}
        optim_sd = {"state": {name: s for name, s in optim_sd["state"].items() if name in own},
                    "param_groups": [dict(g, params=[n for n in g["params"] if n in own])
                                     for g in optim_sd["param_groups"]]}
    if lay.tp > 1:
        _gate_up(model_sd, optim_sd, interleave_gate_up, lay.tp)
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_sd, options=options)
    set_optimizer_state_dict(model, optimizer, optim_sd, options=options)
