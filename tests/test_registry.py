"""The switch registry and apply_all: nothing, each known name, unknown names, conflicts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from optimizers import REGISTRY, ConfigError, SetupContext, SwitchesConfig, apply_all, check_all
from optimizers.base import Optimization, Registry
from optimizers.config import build_section
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM

# One non-baseline value per switch that runs on one CPU process.
ENABLED = {
    "amp": "bf16", "activation_checkpointing": "full", "grad_accumulation": 2, "compile": "default",
    "attention": "eager", "param_sharing": "all", "ffn_pruning": "structured", "optimizer": "sgd",
    "lr_schedule": "step", "dataloader": 1, "dynamic_batch": "latency", "stability": {"clip_grad_norm": 0.5},
    "init": "xavier", "checkpoint": 5,
}
NEEDS_OTHER_CONTEXT = {"ddp": "several ranks", "memory_fraction": "CUDA"}


def model() -> GLMForCausalLM:
    torch.manual_seed(0)
    return GLMForCausalLM(model_config("tiny", num_hidden_layers=4))


def test_every_catalog_switch_is_registered_once_in_pipeline_order() -> None:
    names = REGISTRY.names()
    assert sorted(names) == sorted(f.name for f in dataclasses.fields(SwitchesConfig))
    # the order the catalog documents: sharing before checkpointing before compile before DDP
    assert names.index("param_sharing") < names.index("activation_checkpointing") < names.index("compile") \
        < names.index("ddp") < names.index("optimizer")
    assert set(ENABLED) | set(NEEDS_OTHER_CONTEXT) == set(names)


def test_applying_nothing_gives_the_plain_baseline() -> None:
    m = model()
    setup = apply_all(m, SwitchesConfig(), SetupContext())
    assert setup.applied == []
    assert setup.model is m and isinstance(setup.optimizer, torch.optim.AdamW)
    assert setup.autocast_dtype is None and setup.scaler is None and setup.accumulation_steps == 1
    assert setup.clip_grad_norm == 1.0


@pytest.mark.parametrize("name", sorted(ENABLED))
def test_each_known_switch_applies_and_says_what_it_did(name: str) -> None:
    switches = build_section(SwitchesConfig, {name: ENABLED[name]}, "switches")
    assert REGISTRY.get(name).enabled(getattr(switches, name))
    setup = apply_all(model(), switches, SetupContext())
    assert name in setup.applied
    assert any(note.startswith(f"{name}:") for note in setup.notes)


def test_an_unknown_name_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        REGISTRY.get("fp8")
    assert err.value.key == "switches.fp8" and "amp" in str(err.value) and "ddp" in str(err.value)
    with pytest.raises(ConfigError, match="allowed: amp"):
        build_section(SwitchesConfig, {"fp8": "on"}, "switches")


def test_a_duplicate_registration_is_refused() -> None:
    registry = Registry()
    registry.register(REGISTRY.get("amp"))
    with pytest.raises(ValueError, match="twice"):
        registry.register(REGISTRY.get("amp"))
    stray = dataclasses.replace(REGISTRY.get("amp"), name="warp_drive")
    assert isinstance(stray, Optimization)
    with pytest.raises(ValueError, match="no section"):
        registry.register(stray)


@pytest.mark.parametrize(("switches", "ctx", "key", "reason"), [
    ({"attention": "linear"}, SetupContext(objective="blank_infilling"), "switches.attention", "causal"),
    ({"ddp": "powersgd"}, SetupContext(world_size=1), "switches.ddp", "several ranks"),
    ({"ddp": {"backend": "nccl"}}, SetupContext(world_size=2), "switches.ddp", "CUDA"),
    ({"memory_fraction": 0.5}, SetupContext(), "switches.memory_fraction", "cpu"),
    ({"optimizer": {"name": "rmsprop", "impl": "fused"}}, SetupContext(), "switches.optimizer", "fused"),
])
def test_combinations_that_cannot_run_are_refused_with_the_reason(switches: dict, ctx: SetupContext,
                                                                  key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_all(build_section(SwitchesConfig, switches, "switches"), ctx)
    assert err.value.key == key and reason in str(err.value)
