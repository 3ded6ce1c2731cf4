"""ALBERT-style cross-layer parameter sharing (000 3.2; shared/reference/glm-spec.md 4).

Layer i runs the block object of its group's first layer: with `all`, block 0 everywhere (HF
ALBERT's default, one layer applied num_hidden_layers times); with `groups` of K, layers
[gK, (g+1)K) run block gK. The last group may be shorter when K does not divide the layer count
(layers 4..5 of 6 with K=4 share block 4); K >= the layer count is the same as `all`.

Parameters are shared, compute is not: a step does the same FLOPs and stores the same
activations as the unshared model. What shrinks is parameter, gradient and optimizer-state
memory, the optimizer step and DDP's all-reduce volume, so a step gets faster only by their share
(the source's ~40% faster epoch, for an RNN, is no figure to expect here). The gradient of a
shared weight is the sum over its applications (autograd accumulates it), so one optimizer update
serves every layer that uses it.

The blocks list then holds the same module several times. `model.parameters()` deduplicates,
but `state_dict()` keeps one key per position, all pointing at one tensor: torch.save stores
the storage once and `load_state_dict` copies each key into the same tensor, so a save/load
round trip of a shared model is exact. Loading a state dict whose duplicate keys disagree (an
unshared checkpoint, e.g. a Hugging Face one) would silently keep the last layer of each group,
so the blocks list refuses it (a load pre-hook). Hugging Face interop (reference_model.hf):
`to_hf` of a shared model gives an ordinary HF model whose layers are equal copies (HF GLM has no
notion of sharing); `from_hf` builds an unshared model, and applying sharing to it afterwards
keeps each group's first layer and drops the trained weights of the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup, blocks
from optimizers.config import Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck

if TYPE_CHECKING:
    from torch import nn


@dataclass
class ParamSharingConfig(Section):
    KEY: ClassVar[str] = "switches.param_sharing"
    mode: str = "off"
    """off; all (one block's parameters used by every layer, ALBERT); groups (each run of K
    consecutive layers shares one block)."""
    group_size: int = 2
    """groups only: K, the layers per shared block."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "all", "groups"])
        self.check_range("group_size", lo=1, hi=1024)


def owners(num_layers: int, mode: str, group_size: int) -> list[int]:
    """owners[i] is the layer whose block layer i runs: 0 for `all`, i - i % K for `groups`."""
    if mode == "all":
        return [0] * num_layers
    if mode == "groups":
        return [i - i % group_size for i in range(num_layers)]
    return list(range(num_layers))


def _refuse_disagreeing_duplicates(owner_of: list[int]) -> Any:
    """A load_state_dict pre-hook for the blocks list: a shared block's keys must all agree."""
    import torch


    def hook(module: nn.ModuleList, state_dict: dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
             missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        for i, owner in enumerate(owner_of):
            if i == owner:
                continue
            for name in module[owner].state_dict():
                a, b = state_dict.get(f"{prefix}{owner}.{name}"), state_dict.get(f"{prefix}{i}.{name}")
                if a is None or b is None or a is b:
                    continue
                if a.shape != b.shape or not torch.equal(a, b.to(a.device)):
                    error_msgs.append(
                        f"param_sharing: layer {i} shares block {owner}, but the state dict's "
                        f"'{prefix}{i}.{name}' differs from '{prefix}{owner}.{name}' (an unshared "
                        "checkpoint?); loading it would keep only one of them")
                    return

    return hook


def apply_param_sharing(setup: TrainSetup, cfg: ParamSharingConfig, ctx: SetupContext) -> None:
    """Make every layer run its group's first block; the other blocks' parameters are dropped."""
    layers = blocks(setup.raw_model)
    before = sum(p.numel() for p in layers.parameters())
    owner_of = owners(len(layers), cfg.mode, cfg.group_size)
    for i, owner in enumerate(owner_of):
        layers[i] = layers[owner]
    layers.register_load_state_dict_pre_hook(_refuse_disagreeing_duplicates(owner_of))
    after = sum(p.numel() for p in layers.parameters())  # parameters() counts a shared block once
    distinct = len(set(owner_of))
    setup.note("param_sharing", f"{cfg.mode}: {len(layers)} layers run {distinct} distinct blocks; block "
                                f"parameters {before:,} -> {after:,} (compute per token unchanged)")


_PARAMS = "param_sharing=all row: parameters -71% on the small preset (4 layers; embedding and head unshared)"

OPTIMIZATION = Optimization(
    name="param_sharing",
    config=ParamSharingConfig,
    apply=apply_param_sharing,
    enabled=lambda c: c.mode != "off",
    addresses=(Bottleneck.MEMORY_BOUND, Bottleneck.OPTIMIZER_BOUND, Bottleneck.COMM_BOUND),
    effect="block parameters, gradients and optimizer state shrink by the number of layers per shared "
           "block, and so do the optimizer step and DDP's all-reduce volume; FLOPs per token and "
           "activation memory do not change.",
    cost="a different, smaller-capacity model: at equal depth it reaches a higher loss than the unshared "
         "one.",
    risk="checkpoints hold duplicate keys for one tensor; loading an unshared checkpoint into a shared "
         "model is refused; sharing a trained unshared model keeps only each group's first layer.",
    source="000 3.2",
    candidates=(
        Candidate(set={"switches.param_sharing.mode": "all"}, applies=lambda c: c.mode != "all",
                  risk="changes_model",
                  effects=(Effect("optimizer", "shrinks", 0.5, 0.7,
                                  basis="param_sharing=all row: optimizer 10 -> 4 ms (-60%)"),
                           Effect("peak_memory", "shrinks", 0.1, 0.2,
                                  basis="param_sharing=all row: total -15% (activations unchanged)"),
                           Effect("comm_bytes", "shrinks", 0.6, 0.9,
                                  basis=_PARAMS + ": DDP all-reduces one gradient per parameter; deeper "
                                                  "models share more"),
                           Effect("comm", "shrinks", 0.4, 0.8,
                                  basis=_PARAMS + ": all-reduce time follows the bytes where bandwidth-bound "
                                                  "(not measured)")),
                  note="a smaller-capacity model (loss +0.7% on the small preset); forward and backward "
                       "do the same FLOPs"),
    ),
)
