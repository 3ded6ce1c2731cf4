"""The setup context tests apply switches in: a default CPU run's, built the one way runs build it."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from optimizers import SetupContext
from reference_model.config import DataConfig, TrainConfig
from reference_model.context import setup_context


def context(**overrides: Any) -> SetupContext:
    """`setup_context` of the config's defaults on one CPU process, with single fields replaced
    (`context(world_size=2)`, `context(device=torch.device("cuda"))`); torchrun's environment, if
    any, is ignored."""
    ctx = setup_context(TrainConfig(device="cpu"), DataConfig(), device=torch.device("cpu"), rank=0, world_size=1)
    return dataclasses.replace(ctx, **overrides)
