"""Gradients across ranks: the global norm and clipping when some gradients are DTensors (sharded
or split over ranks) or each pipeline stage holds its own, and a tensor's local part."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def is_dtensor(t: torch.Tensor) -> TypeGuard[DTensor]:
    """A DTensor (sharded or split over ranks): none exists unless its module was imported, so a
    plain run never pays for importing it (about a second of every start)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local_part(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of `t`: a DTensor's local shard, any other tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def total_grad_norm(params: Sequence[torch.Tensor], *, group: Any = None) -> torch.Tensor:
    """The global L2 norm of the gradients, also when some are DTensors (sharded or split over ranks)
    and when `group`'s ranks (pipeline stages) each hold the gradients of their own parameters.

    torch's own norm takes all plain tensors or all DTensors of one mesh; a tensor-parallel model
    mixes split block weights with whole norms and embeddings, so each kind is normed on its own
    and DTensor norms are completed across their ranks.
    """
    norm = _local_grad_norm(params)
    if group is None:
        return norm
    squared = norm.float() ** 2
    torch.distributed.all_reduce(squared, group=group)
    return squared.sqrt()


def _local_grad_norm(params: Sequence[torch.Tensor]) -> torch.Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    plain = [g for g in grads if not is_dtensor(g)]
    split = [g for g in grads if is_dtensor(g)]
    if not split:
        return torch.nn.utils.get_total_norm(plain)
    meshes = {id(g.device_mesh) for g in split}
    if not plain and len(meshes) == 1:
        return cast("DTensor", torch.nn.utils.get_total_norm(split)).full_tensor()  # DTensors in, DTensor out
    parts = [torch.linalg.vector_norm(g).full_tensor() for g in split]
    if plain:
        parts.append(torch.nn.utils.get_total_norm(plain))
    return torch.linalg.vector_norm(torch.stack(parts))


def clip_grads(params: Sequence[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale the gradients so their global norm is at most `max_norm` (torch's clip_grads_with_norm_),
    a DTensor's by its local part: the same factor on every rank."""
    grads = [p.grad for p in params if p.grad is not None]
    if not any(is_dtensor(g) for g in grads):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm)
        return
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    torch._foreach_mul_([local_part(g) for g in grads], coef)
