"""Weight initialization scheme: normal (HF GLM), xavier (Glorot) or he (Kaiming) (004 2.1).

Generic over any model: every `nn.Linear` weight gets the scheme, biases zero; every
`nn.Embedding` gets N(0, std) whatever the scheme (a lookup has no fan-in for Xavier or He to
balance, and HF initializes embeddings this way), its padding row zero; every norm (a module whose
class name ends in "Norm", with a 1-D weight) gets weight one and bias zero.

| scheme | Linear weight | std of the weight |
| --- | --- | --- |
| normal | N(0, std) | std (0.02: GLM's initializer_range) |
| xavier | U(-a, a), a = sqrt(6 / (fan_in + fan_out)) | sqrt(2 / (fan_in + fan_out)) |
| he | N(0, 2 / fan_in) (Kaiming normal, fan_in, ReLU gain) | sqrt(2 / fan_in) |

Xavier and He keep the activation variance constant through one layer (for tanh-like and ReLU-like
activations, as the source document says); neither accounts for the residual stream, so in a deep
pre-norm transformer they start with much larger weights than GPT-style N(0, 0.02) and a higher
initial loss. Draws use torch's global generator: the same seed gives the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import Section
from optimizers.vocabulary import Bottleneck

if TYPE_CHECKING:
    from torch import nn


@dataclass
class InitConfig(Section):
    KEY: ClassVar[str] = "switches.init"
    scheme: str = "normal"
    """normal (N(0, std), as HF GLM), xavier (Glorot uniform), he (Kaiming normal, fan_in)."""
    std: float = 0.02

    def __post_init__(self) -> None:
        self.check_choice("scheme", ["normal", "xavier", "he"])
        self.check_range("std", lo=0.0, hi=1.0, lo_open=True)


def _norm_weight(module: nn.Module) -> nn.Parameter | None:
    """The scale of a norm layer (a module named *Norm with a 1-d `weight`); None for any other module."""
    from torch import nn

    weight = getattr(module, "weight", None)
    if type(module).__name__.endswith("Norm") and isinstance(weight, nn.Parameter) and weight.dim() == 1:
        return weight
    return None


def init_weights(model: nn.Module, scheme: str, std: float) -> dict[str, int]:
    """Re-initialize `model` in place; returns how many modules of each kind were touched."""
    import torch
    from torch import nn

    with torch.no_grad():
        counts = {"linear": 0, "embedding": 0, "norm": 0}
        for module in model.modules():  # yields a shared module once, so it is drawn once
            if isinstance(module, nn.Linear):
                if scheme == "normal":
                    nn.init.normal_(module.weight, mean=0.0, std=std)
                elif scheme == "xavier":
                    nn.init.xavier_uniform_(module.weight)
                else:
                    nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
                counts["linear"] += 1
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
                counts["embedding"] += 1
            elif (weight := _norm_weight(module)) is not None:
                nn.init.ones_(weight)
                if isinstance(bias := getattr(module, "bias", None), nn.Parameter):
                    nn.init.zeros_(bias)
                counts["norm"] += 1
        return counts


def apply_init(setup: TrainSetup, cfg: InitConfig, ctx: SetupContext) -> None:
    counts = init_weights(setup.raw_model, cfg.scheme, cfg.std)
    linear = f"N(0, {cfg.std:g})" if cfg.scheme == "normal" else cfg.scheme
    setup.note("init", f"{counts['linear']} Linear weights {linear}, {counts['embedding']} embeddings "
                       f"N(0, {cfg.std:g}), {counts['norm']} norms to one, biases zero")


OPTIMIZATION = Optimization(
    name="init",
    config=InitConfig,
    apply=apply_init,
    enabled=lambda c: c != InitConfig(),
    addresses=(Bottleneck.UNSTABLE,),
    effect="changes the starting point: the initial loss and how fast and stably it falls, not the "
           "cost of a step",
    cost="none per step (one pass over the weights at start)",
    risk="xavier and he start a deep transformer with far larger weights than N(0, 0.02): a higher "
         "initial loss and early spikes are likely",
    source="004 2.1",
)
