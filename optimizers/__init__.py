"""The catalog of performance techniques ("optimizers" here means optimizations, not torch.optim).

Each switch is one module holding its config section, one `apply_<switch>(setup, cfg, ctx)` and an
`Optimization` record of its facts (the bottlenecks it addresses, its candidate changes with their
expected effects and requirements, cost, risk, what it conflicts with). The torch optimizer choice
is one of the switches (`optim.py`). The catalog is generic: it works on any model with a `blocks`
list whose blocks have `self_attn` and `mlp` (see `optimizers.base.blocks`), and knows nothing of
GLM specifics, profiling or the run store.
"""

from optimizers.base import Optimization, SetupContext, TrainSetup, blocks
from optimizers.catalog import REGISTRY, SwitchesConfig, apply_all, check_all
from optimizers.config import ConfigError
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck, Capability

__all__ = [
    "REGISTRY", "Bottleneck", "Candidate", "Capability", "ConfigError", "Effect", "Optimization", "SetupContext",
    "SwitchesConfig", "TrainSetup", "apply_all", "blocks", "check_all",
]
