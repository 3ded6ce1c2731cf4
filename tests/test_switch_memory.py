"""activation_checkpointing and memory_fraction: same gradients for less saved memory; a cap only on CUDA."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from optimizers import SwitchesConfig
from optimizers.activation_checkpointing import (
    ActivationCheckpointingConfig,
    apply_activation_checkpointing,
    is_checkpointed,
)
from optimizers.base import TrainSetup
from optimizers.catalog import check_all
from optimizers.config import ConfigError, build_section
from optimizers.memory_fraction import MemoryFractionConfig, apply_memory_fraction
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM
from tests.contexts import context

CUDA = context(device=torch.device("cuda"))  # a context only: nothing here touches a GPU


@pytest.fixture(scope="module")
def base() -> GLMForCausalLM:
    torch.manual_seed(0)
    return GLMForCausalLM(model_config("tiny", num_hidden_layers=4))


def checkpointed(model: nn.Module, mode: str, every: int = 2) -> nn.Module:
    model = copy.deepcopy(model)
    cfg = ActivationCheckpointingConfig(mode=mode, every=every)
    apply_activation_checkpointing(TrainSetup(model=model), cfg, context())
    return model


def saved_for_backward(model: nn.Module, ids: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes of activation storage kept alive for backward by one forward, and its loss.

    Every tensor autograd saves outside a checkpointed region goes through the pack hook (inside one,
    checkpoint's own hook takes over and keeps nothing); the inputs a checkpointed block keeps to
    recompute from are caught by a pre-hook on every block. Storages count once (views share
    them) and parameters not at all (they live anyway).
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    def keep_inputs(module: nn.Module, args: tuple) -> None:
        for a in args:
            if isinstance(a, torch.Tensor):
                keep(a)

    handles = [block.register_forward_pre_hook(keep_inputs) for block in model.blocks]
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        loss = model(ids, labels=ids).loss
    for handle in handles:
        handle.remove()
    return sum(kept.values()), loss


def test_checkpointing_keeps_gradients_and_saves_memory(base: GLMForCausalLM) -> None:
    ids = torch.randint(0, 320, (4, 32), generator=torch.Generator().manual_seed(1))
    saved, grads = {}, {}
    for mode in ("off", "full", "selective"):
        model = copy.deepcopy(base) if mode == "off" else checkpointed(base, mode)
        saved[mode], loss = saved_for_backward(model, ids)
        loss.backward()
        grads[mode] = {n: p.grad for n, p in model.named_parameters()}
    for mode in ("full", "selective"):
        for name, grad in grads["off"].items():
            torch.testing.assert_close(grads[mode][name], grad, rtol=0, atol=1e-6, msg=f"{mode} {name}")
    # measured on this model: full keeps 13% of the plain run's activation bytes, selective 57%
    assert saved["full"] <= saved["off"] / 2
    assert saved["full"] < saved["selective"] < saved["off"]


def test_module_tree_and_state_dict_are_untouched(base: GLMForCausalLM) -> None:
    model = checkpointed(base, "full")
    assert [n for n, _ in model.named_modules()] == [n for n, _ in base.named_modules()]
    assert list(model.state_dict()) == list(base.state_dict())
    model.load_state_dict(base.state_dict(), strict=True)  # so HF conversion keeps working


def test_selective_picks_every_nth_and_wrapping_is_idempotent(base: GLMForCausalLM) -> None:
    model = checkpointed(base, "selective", every=2)
    assert [is_checkpointed(b) for b in model.blocks] == [True, False, True, False]
    forward = model.blocks[0].forward
    apply_activation_checkpointing(TrainSetup(model=model), ActivationCheckpointingConfig(mode="full"),
                                   context())
    assert model.blocks[0].forward is forward  # not wrapped twice
    assert all(is_checkpointed(b) for b in model.blocks)


def test_a_deep_copy_recomputes_its_own_block(base: GLMForCausalLM) -> None:
    model = checkpointed(base, "full")
    clone = copy.deepcopy(model)
    inner = clone.blocks[0].forward.args[0]  # the bound forward the checkpoint wrapper runs
    assert inner.__self__ is clone.blocks[0]


def test_a_shared_block_is_wrapped_once(base: GLMForCausalLM) -> None:
    model = copy.deepcopy(base)
    shared = model.blocks[0]
    model.model.layers = nn.ModuleList([shared, shared, shared, shared])  # ALBERT-style sharing
    setup = TrainSetup(model=model)
    apply_activation_checkpointing(setup, ActivationCheckpointingConfig(mode="selective", every=3),
                                   context())
    assert is_checkpointed(shared)
    assert shared.forward.args[0].__func__ is type(shared).forward  # wraps the plain forward, once
    assert "positions 0, 1, 2, 3 of 4 (1 distinct)" in setup.notes[-1]  # it runs everywhere
    ids = torch.randint(0, 320, (2, 16))
    model(ids, labels=ids).loss.backward()


def test_memory_fraction_is_refused_off_cuda() -> None:
    switches = build_section(SwitchesConfig, {"memory_fraction": 0.5}, "switches")
    with pytest.raises(ConfigError, match="memory_fraction caps CUDA memory; this run is on cpu"):
        check_all(switches, context(device=torch.device("cpu")))
    check_all(build_section(SwitchesConfig, {}, "switches"), context(device=torch.device("cpu")))


def test_memory_fraction_zero_is_no_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object) -> None:
        raise AssertionError("a fraction of 0 must not reach torch (it would be a cap of zero bytes)")

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", never)
    setup = TrainSetup(model=nn.Linear(2, 2))
    apply_memory_fraction(setup, MemoryFractionConfig(fraction=0.0), CUDA)
    assert setup.notes == ["memory_fraction: no cap"]


def test_memory_fraction_passes_a_device_index(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: type("Props", (), {"total_memory": 80 * 2**30})())
    setup = TrainSetup(model=nn.Linear(2, 2))
    # torch raises on a bare torch.device("cuda"): the switch must resolve the index itself
    apply_memory_fraction(setup, MemoryFractionConfig(fraction=0.5), CUDA)
    assert calls == [(0.5, 3)]
    assert "40.0 of 80.0 GiB" in setup.notes[0]
