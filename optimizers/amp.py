"""Automatic mixed precision: bf16 or fp16 matmuls under autocast, fp16 with a GradScaler (000 2.2; 004 3.1).

The trainer wraps every forward in `torch.autocast(device, dtype=setup.autocast_dtype)` and, with
a scaler, scales the loss before backward, unscales before clipping, and lets `scaler.step` drop
any step whose gradients hold inf/NaN (then `scaler.update` halves the scale). Weights, optimizer
state and the loss stay fp32: autocast casts per operator, it does not convert the model.

The source documents use `torch.cuda.amp.autocast()` / `GradScaler()`, deprecated aliases of
`torch.autocast("cuda")` / `torch.amp.GradScaler("cuda")`; they also pair GradScaler with fp16
only in spirit. bf16 has fp32's exponent range, so it needs no scaler: we add one only for fp16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from optimizers.base import Optimization, SetupContext, Switches, TrainSetup
from optimizers.config import Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck, Capability


@dataclass
class AmpConfig(Section):
    KEY: ClassVar[str] = "switches.amp"
    dtype: str = "off"
    """Autocast dtype: off (fp32), bf16, or fp16 (fp16 always runs with a GradScaler)."""
    init_scale: float = 2.0**16
    """fp16 only: the GradScaler's starting loss scale."""
    growth_interval: int = 2000
    """fp16 only: steps without inf/NaN before the scale doubles."""

    def __post_init__(self) -> None:
        self.check_choice("dtype", ["off", "bf16", "fp16"])
        self.check_range("init_scale", lo=0, hi=2.0**64, lo_open=True)
        self.check_range("growth_interval", lo=1, hi=10**9)

# torch.amp.GradScaler documents these device types (its unscale kernel exists for them).
_SCALER_DEVICE_TYPES = ("cuda", "cpu")


def apply_amp(setup: TrainSetup, cfg: AmpConfig, ctx: SetupContext) -> None:
    """Set the autocast dtype; for fp16 also a GradScaler on the run's device type."""
    import torch

    if cfg.dtype == "off":
        setup.note("amp", "off: fp32 compute")
        return
    setup.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[cfg.dtype]
    if cfg.dtype == "fp16":
        # fp16's 5-bit exponent underflows small gradients to zero: scale the loss up, unscale after
        setup.scaler = torch.amp.GradScaler(ctx.device.type, init_scale=cfg.init_scale,
                                            growth_interval=cfg.growth_interval)
        setup.note("amp", f"fp16 autocast on {ctx.device.type} with GradScaler (init scale "
                          f"{cfg.init_scale:g}, doubles after {cfg.growth_interval} good steps)")
    else:
        setup.note("amp", f"bf16 autocast on {ctx.device.type} (no loss scaling: bf16 has fp32's range)")


def _check_device(switches: Switches, ctx: SetupContext) -> str | None:
    import torch

    dtype = switches.amp.dtype
    if dtype == "off":
        return None
    kind = ctx.device.type
    if not torch.amp.is_autocast_available(kind):
        return f"{dtype}: torch has no autocast for device type {kind!r}"
    if dtype == "fp16" and kind not in _SCALER_DEVICE_TYPES:
        return (f"fp16 needs a GradScaler, which torch supports on {', '.join(_SCALER_DEVICE_TYPES)}, "
                f"not {kind!r}; use amp=bf16 or off")
    if (dtype == "bf16" and kind == "cuda" and torch.cuda.is_available()
            and not torch.cuda.is_bf16_supported(including_emulation=False)):
        name = torch.cuda.get_device_name(ctx.device)
        return (f"bf16: {name} has no native bf16 (needs compute capability >= 8.0); it would be "
                "emulated and slower than fp32; use amp=fp16")
    return None


# Measured on CPU (switch_effects.md, row amp=bf16): forward -30%, backward -31%, on a CPU whose
# calibrated bf16/fp32 matmul peak ratio is ~2.3 (docs/BENCHMARKS.md: 429 vs 182 GFLOP/s), so a
# matmul share of ~0.55 of forward and backward: 0.3 = 0.55 x (1 - 1/2.3). Larger on GPUs.
_MATMUL_SHARE = (0.5, 0.85)
_MATMUL_BASIS = ("amp=bf16 row: forward -30%, backward -31% at a measured ~2.3x bf16/fp32 peak ratio, i.e. a "
                 "matmul share of ~0.55; matmuls are a larger share on GPUs; fp16 assumed alike (not measured here)")
_MEMORY = Effect("peak_memory", "shrinks", 0.2, 0.35,
                 basis="amp=bf16 row: total -24%, saved activations -31% (weights, grads and AdamW state stay fp32)")


def _half(dtype: str, speedup: str, requires: tuple[Capability, ...], *, from_fp32: bool) -> Candidate:
    """`dtype` from fp32 (matmuls faster, activations half the bytes), or from the other half dtype
    (only the matmul speed differs: both are two bytes, so memory stays; it pays only where the run's
    dtype is emulated, e.g. bf16 on a GPU older than compute capability 8.0)."""
    effects = (Effect("forward", "shrinks", *_MATMUL_SHARE, scales_with=speedup, basis=_MATMUL_BASIS),
               Effect("backward", "shrinks", *_MATMUL_SHARE, scales_with=speedup, basis=_MATMUL_BASIS))
    note = "bf16 needs no loss scaling" if dtype == "bf16" else \
        "fp16 runs with a GradScaler: watch skipped steps while the scale settles"
    return Candidate(
        set={"switches.amp.dtype": dtype}, effects=effects + (_MEMORY,) if from_fp32 else effects,
        requires=requires, risk="numerics", note=note,
        applies=(lambda c: c.dtype == "off") if from_fp32 else (lambda c: c.dtype not in ("off", dtype)))


_FP32 = Candidate(
    set={"switches.amp.dtype": "off"},
    effects=(Effect("forward", "shrinks", *_MATMUL_SHARE, scales_with="run_dtype_speedup", basis=_MATMUL_BASIS),
             Effect("backward", "shrinks", *_MATMUL_SHARE, scales_with="run_dtype_speedup", basis=_MATMUL_BASIS),
             Effect("peak_memory", "grows", 0.25, 0.55, basis="the inverse of amp=bf16's -20..-35%")),
    risk="numerics", applies=lambda c: c.dtype != "off",
    note="fp32 matmuls: the fast path of a device without native low-precision ones")
"""Back to fp32 where the run's dtype is emulated (slower than fp32 at the run's own shapes)."""


OPTIMIZATION = Optimization(
    name="amp",
    config=AmpConfig,
    apply=apply_amp,
    enabled=lambda c: c.dtype != "off",
    addresses=(Bottleneck.COMPUTE_BOUND, Bottleneck.MEMORY_BOUND, Bottleneck.LOW_PRECISION_UNUSED,
               Bottleneck.PRECISION_EMULATED),
    effect="matmuls run on bf16/fp16 tensor cores (up to several x the fp32 throughput on GPUs) and "
           "the activations autocast produces are half the bytes",
    cost="a cast per autocast operator (weights are re-cast every forward); fp16 adds a scale, an "
         "unscale and an inf check per step; on CPUs without native half matmuls it can be slower",
    risk="fp16 overflows without scaling and skips steps while the scale settles (watch skipped steps); "
         "bf16 has 8 mantissa bits, so losses differ slightly from fp32",
    source="000 2.2; 004 3.1",
    needs="bf16: a CPU or a CUDA GPU with compute capability >= 8.0; fp16: CUDA (or CPU, slowly)",
    checks=(_check_device,),
    candidates=tuple(_half(dtype, f"{dtype}_matmul_speedup", needs, from_fp32=start)
                     for start in (True, False)
                     for dtype, needs in (("bf16", (Capability.FAST_BF16_MATMUL,)),
                                          ("fp16", (Capability.FAST_FP16_MATMUL, Capability.FP16_OVER_BF16)))
                     ) + (_FP32,),
)
