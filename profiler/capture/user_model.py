"""A user's own model as a run records it: its class, size and FLOPs per token, and the counters on a DDP
model's gradient all-reduces (profiler.api and the framework callbacks)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from profiler.instruments.comm import CommStats


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module inside DDP / DataParallel (`.module`) and torch.compile (`._orig_mod`)."""
    while True:
        if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
            model = model._orig_mod
        else:
            return model


def model_record(model: torch.nn.Module | None, flops_per_token: float | None) -> dict[str, Any]:
    """run.json `model` of a user's model: external, its class and size, and where FLOPs/token come from."""
    record: dict[str, Any] = {"external": True, "class": None, "num_params": None,
                              "flops_per_token": None, "flops_source": None}
    if model is not None:
        inner = unwrap(model)
        record["class"] = f"{type(inner).__module__}.{type(inner).__qualname__}"
        record["num_params"] = sum(p.numel() for p in inner.parameters())
    if flops_per_token is not None:
        record.update(flops_per_token=float(flops_per_token), flops_source="given (flops_per_token)")
    elif record["num_params"]:
        record.update(flops_per_token=6.0 * record["num_params"],
                      flops_source="6N (N = the model's parameter count; attention's FLOPs not counted: "
                                   "pass flops_per_token= for them)")
    else:
        record["flops_source"] = "not known: pass flops_per_token= or model= for MFU"
    return record


def count_allreduces(model: torch.nn.Module | None, device: torch.device, world_size: int
                     ) -> tuple[CommStats | None, str]:
    """Communication counters on a DDP model's gradient all-reduces (torch's own allreduce hook, the
    one DDP runs by default, wrapped as profile-run wraps it), or None and why not."""
    if world_size == 1:
        return None, "one process: nothing to communicate"
    if not isinstance(model, DistributedDataParallel):
        return None, "not measured: pass the DistributedDataParallel model as model= to count its all-reduces"
    comm = CommStats(device)
    try:
        model.register_comm_hook(None, comm.wrap(default_hooks.allreduce_hook, None))
    except RuntimeError as exc:  # the loop registered a hook of its own (DDP takes one)
        return None, f"not measured: the model has a comm hook of its own ({exc})"
    return comm, "counted: DDP gradient all-reduces"
