"""FFN pruning: magnitude masks (unstructured) or removed channels (structured) (000 3.3).

unstructured: in every block's `gate_up_proj` and `down_proj` weight, the share S of entries with
the smallest |w| is set to zero at setup and kept zero for the whole run: their gradients are
masked (so optimizer moments stay zero) and the mask is re-applied after every optimizer step.
Shapes do not change and dense matmuls do exactly the same work on zeros: it saves no time and
no memory (the mask even costs one bool per weight). The source's 38% latency gain from 60%
sparsity needs sparse kernels (e.g. 2:4 semi-structured on Ampere+), which this is not.

structured: the share S of FFN channels (intermediate units) with the lowest importance
||gate_j|| * ||up_j|| * ||down[:, j]|| is removed from every block: gate_up_proj and down_proj
are replaced by new, smaller Linears, so the matmuls really shrink (FFN FLOPs and parameters
by S). Unit j lives in gate rows [0, I), up rows [I, 2I) and down column j, and all three are
kept or dropped together, so each kept unit computes what it computed before. The model's
config (intermediate_size) is not touched: it describes the unpruned shape, and a checkpoint of
a pruned model loads only into a model pruned the same way.

Masks and rankings come from the weights at setup (after `init`). A resumed run rebuilds the
same ones from the same seed before its checkpoint is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from optimizers.base import FeedForward, Optimization, SetupContext, TrainSetup, blocks
from optimizers.config import Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck

if TYPE_CHECKING:
    from torch import Tensor, nn


@dataclass
class FfnPruningConfig(Section):
    KEY: ClassVar[str] = "switches.ffn_pruning"
    mode: str = "off"
    """off; unstructured (magnitude mask, shapes unchanged, kept through training); structured
    (removes whole FFN channels, so the matrices shrink)."""
    sparsity: float = 0.5
    """Share of weights (unstructured) or FFN channels (structured) removed, in [0, 1)."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "unstructured", "structured"])
        self.check_range("sparsity", lo=0.0, hi=1.0, hi_open=True)


def _unique_mlps(model: nn.Module) -> list[FeedForward]:
    """Each block's `mlp` once, in order (shared blocks appear several times in the blocks list)."""
    return list({id(block.mlp): block.mlp for block in blocks(model)}.values())


# --------------------------------------------------------------------------------------------
# unstructured


def magnitude_mask(weight: Tensor, sparsity: float) -> Tensor:
    """A bool mask, False on exactly round(sparsity * numel) entries of smallest |w| (ties broken
    by index). Sorts instead of torch.quantile, which refuses tensors over 2**24 elements."""
    import torch

    n_zero = round(sparsity * weight.numel())
    mask = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
    if n_zero:
        mask[torch.argsort(weight.detach().abs().flatten(), stable=True)[:n_zero]] = False
    return mask.view_as(weight)


class MagnitudeMasks:
    """Fixed masks over some weights: zeroes them now, masks their gradients, and re-zeroes them
    when called (a post-step hook: weight decay or momentum must not revive a pruned weight)."""

    def __init__(self, weights: list[Tensor], sparsity: float) -> None:
        self.pairs = [(w, magnitude_mask(w, sparsity)) for w in weights]
        for weight, mask in self.pairs:
            # zero the gradient where pruned, so Adam's moments of those entries stay exactly zero
            weight.register_hook(lambda grad, mask=mask: grad * mask)
        self()

    def __call__(self) -> None:
        import torch

        with torch.no_grad():
            for weight, mask in self.pairs:
                weight.mul_(mask)

    def sparsity(self) -> float:
        """Share of masked entries over all masked weights."""
        zeros = sum(int((~mask).sum()) for _, mask in self.pairs)
        return zeros / max(1, sum(mask.numel() for _, mask in self.pairs))


# --------------------------------------------------------------------------------------------
# structured


def channel_importance(mlp: FeedForward) -> Tensor:
    """(I,) importance of each FFN unit: ||gate row|| * ||up row|| * ||down column||."""
    gate, up = mlp.gate_up_proj.weight.detach().float().chunk(2, dim=0)  # (I, d) each: gate first
    down = mlp.down_proj.weight.detach().float()  # (d, I)
    return gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)


def _linear_like(old: nn.Linear, weight: Tensor, bias: Tensor | None) -> nn.Linear:
    import torch
    from torch import nn

    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None,
                    device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if bias is not None:
            new.bias.copy_(bias)
    new.requires_grad_(old.weight.requires_grad)
    return new


def prune_channels(mlp: FeedForward, sparsity: float) -> tuple[int, int]:
    """Keep the I - round(S * I) most important units (at least one) of a SwiGLU mlp, in their
    original order, in new smaller Linears. Returns (units before, units after)."""
    import torch

    with torch.no_grad():
        gate_up, down = mlp.gate_up_proj, mlp.down_proj
        units = down.weight.shape[1]
        if gate_up.weight.shape[0] != 2 * units:
            raise ValueError(f"gate_up_proj has {gate_up.weight.shape[0]} rows, expected 2 * {units} "
                             "(gate rows then up rows)")
        keep_n = max(1, units - round(sparsity * units))
        keep = channel_importance(mlp).topk(keep_n).indices.sort().values  # (k,), original order
        rows = torch.cat((keep, keep + units))  # the same units in the gate half and the up half
        mlp.gate_up_proj = _linear_like(gate_up, gate_up.weight[rows],
                                        None if gate_up.bias is None else gate_up.bias[rows])
        mlp.down_proj = _linear_like(down, down.weight[:, keep], down.bias)  # a unit's bias-free column
        return units, keep_n


# --------------------------------------------------------------------------------------------


def apply_ffn_pruning(setup: TrainSetup, cfg: FfnPruningConfig, ctx: SetupContext) -> None:
    mlps = _unique_mlps(setup.raw_model)
    if cfg.mode == "unstructured":
        masks = MagnitudeMasks([w for mlp in mlps for w in (mlp.gate_up_proj.weight, mlp.down_proj.weight)],
                               cfg.sparsity)
        setup.post_step_hooks.append(masks)
        setup.note("ffn_pruning", f"unstructured: {masks.sparsity():.1%} of {len(masks.pairs)} FFN "
                                  "matrices masked to zero, kept zero after every step (shapes and dense "
                                  "FLOPs unchanged)")
        return
    before = sum(p.numel() for mlp in mlps for p in mlp.parameters())
    widths = [prune_channels(mlp, cfg.sparsity) for mlp in mlps]
    after = sum(p.numel() for mlp in mlps for p in mlp.parameters())
    setup.note("ffn_pruning", f"structured: FFN width {widths[0][0]} -> {widths[0][1]} in {len(mlps)} "
                              f"blocks; FFN parameters {before:,} -> {after:,}")


_STRUCTURED = "ffn_pruning=structured 0.5 row"

OPTIMIZATION = Optimization(
    name="ffn_pruning",
    config=FfnPruningConfig,
    apply=apply_ffn_pruning,
    enabled=lambda c: c.mode != "off",
    addresses=(Bottleneck.COMPUTE_BOUND, Bottleneck.MEMORY_BOUND),
    effect="structured: FFN matmul FLOPs, parameters and optimizer state shrink by the sparsity; "
           "unstructured: none on dense kernels (same shapes, same FLOPs), it only zeroes weights.",
    cost="structured removes capacity at once (higher loss unless trained longer); unstructured adds a "
         "mask per FFN matrix, a gradient multiply and a re-mask after every step.",
    risk="pruning an untrained model ranks units by their random init: the choice only matters for a "
         "trained checkpoint; a structured checkpoint loads only into an identically pruned model.",
    source="000 3.3",
    # Structured only: unstructured masks make nothing faster on dense kernels (ffn_pruning=unstructured
    # 0.6 row: step time +1%, the source's -38% needs sparse kernels), so it has no speed candidate.
    candidates=(
        Candidate(set={"switches.ffn_pruning.mode": "structured", "switches.ffn_pruning.sparsity": 0.5},
                  applies=lambda c: c.mode == "off", risk="changes_model",
                  effects=(Effect("forward", "shrinks", 0.2, 0.3,
                                  basis=f"{_STRUCTURED}: forward 119 -> 84 ms (-29%)"),
                           Effect("backward", "shrinks", 0.2, 0.3,
                                  basis=f"{_STRUCTURED}: backward 239 -> 175 ms (-27%)"),
                           Effect("optimizer", "shrinks", 0.15, 0.35,
                                  basis=f"{_STRUCTURED}: optimizer 10 -> 8 ms, parameters -34%"),
                           Effect("peak_memory", "shrinks", 0.2, 0.3, basis=f"{_STRUCTURED}: total -27%")),
                  note="removes half the FFN channels: capacity lost at once, best on a trained checkpoint"),
    ),
)
