"""Where this process runs and the context the switches are checked and applied in.

The device (`auto`, or this rank's GPU under torchrun), the rank and world size from torchrun's
environment, and the one way to build `optimizers.SetupContext` from a run's config: the trainer,
the launcher and `glmperf plan` build it alike, so there is no second set of defaults.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from optimizers.base import ModelShape, SetupContext
from reference_model.config import DataConfig, GLMConfig, TrainConfig

if TYPE_CHECKING:
    import torch


def resolve_device(name: str) -> torch.device:
    """auto -> cuda or cpu; under torchrun a bare `cuda` means this rank's GPU (LOCAL_RANK)."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def dist_env() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) when not launched by it."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def setup_context(train: TrainConfig, data: DataConfig, *, device: torch.device | None = None,
                  rank: int | None = None, world_size: int | None = None,
                  memory_budget_bytes: int | None = None,
                  wrap_comm_hook: Callable[..., Any] | None = None,
                  model: GLMConfig | None = None) -> SetupContext:
    """The one way to build the context switches are checked and applied in, from the config.

    `device`, `rank` and `world_size` default to what this process is (train.device resolved,
    torchrun's environment); a launcher checking a config for N ranks passes `world_size=N`.
    `model` gives the checks the model's sizes before it is built (layouts must divide its heads).
    """
    env_rank, env_world = dist_env()
    return SetupContext(device=device if device is not None else resolve_device(train.device),
                        world_size=env_world if world_size is None else world_size,
                        rank=env_rank if rank is None else rank,
                        total_steps=train.steps, lr=train.lr, batch_size=train.batch_size,
                        seq_len=data.seq_len, objective=data.objective,
                        memory_budget_bytes=memory_budget_bytes, wrap_comm_hook=wrap_comm_hook,
                        shape=None if model is None else shape_of(model))


def shape_of(cfg: GLMConfig) -> ModelShape:
    """The sizes layout checks divide, from the model config."""
    return ModelShape(num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
                      num_kv_heads=cfg.num_key_value_heads, hidden_size=cfg.hidden_size,
                      intermediate_size=cfg.intermediate_size)
