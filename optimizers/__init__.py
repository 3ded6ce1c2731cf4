"""The catalog of performance techniques ("optimizers" here means optimizations, not torch.optim).

Each switch is one module holding its config section, one `apply_<switch>(setup, cfg, ctx)` and an
`Optimization` record of its facts (the bottlenecks it addresses, its candidate changes with their
expected effects and requirements, cost, risk, what it conflicts with). The torch optimizer choice
is one of the switches (`optim.py`). The catalog is generic: it works on any model with a `blocks`
list whose blocks have `self_attn` and `mlp` (see `optimizers.base.blocks`), and knows nothing of
GLM specifics, profiling or the run store.

The names that need torch (the catalog and its setup types) load on first use, so that reading the
vocabulary, the facts or a config section (`optimizers.config`) does not import torch: commands that
only read stored runs start without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from optimizers.config import ConfigError
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck, Capability

__all__ = [
    "REGISTRY", "Bottleneck", "Candidate", "Capability", "ConfigError", "Effect", "Optimization", "SetupContext",
    "SwitchesConfig", "TrainSetup", "apply_all", "blocks", "check_all",
]

_LAZY = {"Optimization": "optimizers.base", "SetupContext": "optimizers.base", "TrainSetup": "optimizers.base",
         "blocks": "optimizers.base", "REGISTRY": "optimizers.catalog", "SwitchesConfig": "optimizers.catalog",
         "apply_all": "optimizers.catalog", "check_all": "optimizers.catalog"}

if TYPE_CHECKING:
    from optimizers.base import Optimization, SetupContext, TrainSetup, blocks
    from optimizers.catalog import REGISTRY, SwitchesConfig, apply_all, check_all


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'optimizers' has no attribute {name!r}")
