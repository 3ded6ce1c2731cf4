"""The attention switch: which function computes softmax(QK^T)V (or its linear stand-in) in every block.

The implementations, each `fn(q, k, v, *, mask, scale)`, are in optimizers.attention_kernels, loaded when
a setup is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from optimizers.base import Optimization, SetupContext, Switches, TrainSetup, blocks
from optimizers.config import Section
from optimizers.facts import Candidate, Effect, no_modelled_gain
from optimizers.vocabulary import Bottleneck


@dataclass
class AttentionConfig(Section):
    KEY: ClassVar[str] = "switches.attention"
    impl: str = "sdpa"
    """eager (matmul + softmax), sdpa (torch's fused kernels), linear (causal elu+1 kernel, O(T))."""

    def __post_init__(self) -> None:
        self.check_choice("impl", ["eager", "sdpa", "linear"])


def apply_attention(setup: TrainSetup, cfg: AttentionConfig, ctx: SetupContext) -> None:
    """Set every block's `self_attn.attention_fn` to the configured implementation."""
    from optimizers.attention_kernels import ATTENTION

    fn = ATTENTION[cfg.impl]
    # the plain model: a compiled or DDP-wrapped `setup.model` holds the same blocks
    layers = blocks(setup.raw_model)
    for block in layers:
        block.self_attn.attention_fn = fn
    setup.note("attention", f"{cfg.impl} attention ({fn.__name__}) in {len(layers)} blocks")


def _check_objective(switches: Switches, ctx: SetupContext) -> str | None:
    if switches.attention.impl == "linear" and ctx.objective == "blank_infilling":
        return ("linear attention is causal only, but blank_infilling needs a bidirectional Part A "
                "(a prefix mask); use attention=sdpa or eager, or data.objective=causal")
    return None


_SDPA_BASIS = "attention_scaling.md: eager takes 1.28x sdpa's time at T=256, 1.84x at 1024, 4.56x at 4096"
_EAGER_BASIS = ("measured, not modelled: on a CPU under torch.compile with bf16, Inductor fuses eager's mask and "
                "softmax and runs its matmuls as bf16 GEMMs, faster than torch's CPU flash kernel at T=256 "
                "(docs/BENCHMARKS.md section 7: small, AMD EPYC); in fp32 without compile eager is slower, and on "
                "CUDA the flash kernel is made to win")
_LINEAR_BASIS = ("attention_scaling.md: linear takes 0.73x sdpa's time at T=1024, 0.21x at 4096, 0.09x at "
                 "16384 (but 2.36x at T=256)")

OPTIMIZATION = Optimization(
    name="attention",
    config=AttentionConfig,
    apply=apply_attention,
    enabled=lambda c: c.impl != "sdpa",
    addresses=(Bottleneck.ATTENTION_BOUND, Bottleneck.COMPUTE_BOUND),
    effect="linear makes attention O(T*hd^2) instead of O(T^2*hd) per head, so long sequences get "
           "cheaper; eager is the slow unfused baseline kept for comparison and parity.",
    cost="linear changes the model (a different function, lower quality than softmax at equal size); "
         "eager stores the (T, T) scores of every head.",
    risk="linear is causal only (no prefix masks) and its fp32 running sums add a sequential chunk loop "
         "that is slower than sdpa at short T.",
    source="000 3.1",
    needs="sdpa: torch >= 2.0 (its flash kernel on CUDA needs fp16/bf16); linear: a causal objective.",
    checks=(_check_objective,),
    candidates=(
        Candidate(set={"switches.attention.impl": "sdpa"}, applies=lambda c: c.impl == "eager", risk="numerics",
                  effects=(Effect("forward", "shrinks", 0.2, 0.8, scales_with="attention_share", basis=_SDPA_BASIS),
                           Effect("backward", "shrinks", 0.2, 0.8, scales_with="attention_share", basis=_SDPA_BASIS),
                           Effect("peak_memory", "shrinks", 0.1, 0.5,
                                  basis="attention=eager row: total 1.14x sdpa's at T=256 (-12% back to sdpa); "
                                        "eager's (B, H, T, T) scores grow with T^2")),
                  note="sdpa equals eager to 1e-5 (tests/test_attention.py)"),
        Candidate(set={"switches.attention.impl": "eager"}, applies=lambda c: c.impl == "sdpa", risk="numerics",
                  effects=no_modelled_gain(_EAGER_BASIS),
                  note="which kernel wins depends on the device, dtype, compiler and shapes: only a probe on the "
                       "run's own model advises it"),
        Candidate(set={"switches.attention.impl": "linear"}, applies=lambda c: c.impl != "linear",
                  risk="changes_model",
                  effects=(Effect("forward", "shrinks", 0.25, 0.9, scales_with="attention_share",
                                  basis=_LINEAR_BASIS),
                           Effect("backward", "shrinks", 0.25, 0.9, scales_with="attention_share",
                                  basis=_LINEAR_BASIS)),
                  note="pays off only for long sequences (from T ~ 1024; slower below); a different model "
                       "(loss +1% on the small preset), causal only"),
    ),
)
