"""init: each scheme draws the documented statistics, resets norms, biases and embeddings, and is seeded."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from optimizers.base import TrainSetup
from optimizers.init import OPTIMIZATION, InitConfig, apply_init
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM, RMSNorm
from tests.contexts import context


def initialized(scheme: str, std: float = 0.02, seed: int = 0) -> GLMForCausalLM:
    model = GLMForCausalLM(model_config("tiny"))
    torch.manual_seed(seed)
    apply_init(TrainSetup(model=model), InitConfig(scheme=scheme, std=std), context())
    return model


def expected_std(scheme: str, std: float, weight: torch.Tensor) -> float:
    fan_out, fan_in = weight.shape  # nn.Linear stores (out_features, in_features)
    return {"normal": std, "xavier": math.sqrt(2 / (fan_in + fan_out)), "he": math.sqrt(2 / fan_in)}[scheme]


@pytest.mark.parametrize("scheme", ["normal", "xavier", "he"])
def test_linear_weights_have_the_scheme_statistics(scheme: str) -> None:
    model = initialized(scheme, std=0.05)
    large = [m.weight for m in model.modules() if isinstance(m, nn.Linear) and m.weight.numel() >= 16384]
    assert len(large) >= 3  # gate_up of each block and lm_head: over 16k draws, the std is within ~1%
    for weight in large:
        want = expected_std(scheme, 0.05, weight)
        assert abs(weight.std().item() / want - 1) < 0.05, (scheme, tuple(weight.shape))
        assert abs(weight.mean().item()) < 0.05 * want
        if scheme == "xavier":  # Glorot uniform: bounded by sqrt(3) x its std
            assert weight.abs().max().item() <= math.sqrt(3) * want + 1e-7


def test_embeddings_norms_and_biases() -> None:
    model = GLMForCausalLM(model_config("tiny"))
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    biases = [m.bias for m in model.modules() if isinstance(m, nn.Linear) and m.bias is not None]
    with torch.no_grad():  # spoil them, so the test sees the switch reset them
        for p in [m.weight for m in norms] + biases:
            p.fill_(3.0)
    torch.manual_seed(0)
    apply_init(TrainSetup(model=model), InitConfig(scheme="he", std=0.05), context())
    embedding = model.model.embed_tokens.weight
    assert abs(embedding.std().item() / 0.05 - 1) < 0.05  # N(0, std) whatever the scheme
    assert norms and all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in norms)
    assert biases and all(not b.any() for b in biases)  # q/k/v biases


def test_the_same_seed_gives_the_same_weights() -> None:
    a, b, c = initialized("xavier", seed=3), initialized("xavier", seed=3), initialized("xavier", seed=4)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_default_is_off() -> None:
    assert not OPTIMIZATION.enabled(InitConfig())
    assert OPTIMIZATION.enabled(InitConfig(scheme="he")) and OPTIMIZATION.enabled(InitConfig(std=0.01))
