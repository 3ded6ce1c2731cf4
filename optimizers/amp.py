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

import torch

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import AmpConfig, SwitchesConfig

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}

# torch.amp.GradScaler documents these device types (its unscale kernel exists for them).
_SCALER_DEVICE_TYPES = ("cuda", "cpu")


def apply_amp(setup: TrainSetup, cfg: AmpConfig, ctx: SetupContext) -> None:
    """Set the autocast dtype; for fp16 also a GradScaler on the run's device type."""
    if cfg.dtype == "off":
        setup.note("amp", "off: fp32 compute")
        return
    setup.autocast_dtype = DTYPES[cfg.dtype]
    if cfg.dtype == "fp16":
        # fp16's 5-bit exponent underflows small gradients to zero: scale the loss up, unscale after
        setup.scaler = torch.amp.GradScaler(ctx.device.type, init_scale=cfg.init_scale,
                                            growth_interval=cfg.growth_interval)
        setup.note("amp", f"fp16 autocast on {ctx.device.type} with GradScaler (init scale "
                          f"{cfg.init_scale:g}, doubles after {cfg.growth_interval} good steps)")
    else:
        setup.note("amp", f"bf16 autocast on {ctx.device.type} (no loss scaling: bf16 has fp32's range)")


def _check_device(switches: SwitchesConfig, ctx: SetupContext) -> str | None:
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


OPTIMIZATION = Optimization(
    name="amp",
    apply=apply_amp,
    enabled=lambda c: c.dtype != "off",
    addresses=("compute_bound", "memory_bound"),
    effect="matmuls run on bf16/fp16 tensor cores (up to several x the fp32 throughput on GPUs) and "
           "the activations autocast produces are half the bytes",
    cost="a cast per autocast operator (weights are re-cast every forward); fp16 adds a scale, an "
         "unscale and an inf check per step; on CPUs without native half matmuls it can be slower",
    risk="fp16 overflows without scaling and skips steps while the scale settles (watch skipped steps); "
         "bf16 has 8 mantissa bits, so losses differ slightly from fp32",
    source="000 2.2; 004 3.1",
    needs="bf16: a CPU or a CUDA GPU with compute capability >= 8.0; fp16: CUDA (or CPU, slowly)",
    checks=(_check_device,),
)
