"""CUDA per-process memory cap (004 2.5).

`torch.cuda.set_per_process_memory_fraction(f, device)` caps what this process's caching allocator
may hold at f x the device's total memory; an allocation beyond it raises an out-of-memory error at
once, even though the device has room. It is for sharing a GPU between processes (or rehearsing a
smaller GPU), not an optimization: the source document says it "prevents out-of-memory", but it
makes this process hit OOM sooner, so that the others sharing the device do not. It changes no
speed and no numerics; the memory it leaves free is what the other processes gain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from optimizers.base import Optimization, SetupContext, Switches, TrainSetup
from optimizers.config import Section


@dataclass
class MemoryFractionConfig(Section):
    KEY: ClassVar[str] = "switches.memory_fraction"
    fraction: float = 0.0
    """CUDA per-process memory cap as a share of device memory (0 = no cap)."""

    def __post_init__(self) -> None:
        self.check_range("fraction", lo=0.0, hi=1.0)


def apply_memory_fraction(setup: TrainSetup, cfg: MemoryFractionConfig, ctx: SetupContext) -> None:
    import torch

    if cfg.fraction == 0:  # 0 means "no cap"; torch would read it as a cap of zero bytes
        setup.note("memory_fraction", "no cap")
        return
    # torch wants an index: a bare torch.device("cuda") raises, so resolve it to the current device
    index = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(float(cfg.fraction), index)
    total = torch.cuda.get_device_properties(index).total_memory
    setup.note("memory_fraction", f"CUDA allocator capped at {cfg.fraction:g} of cuda:{index} "
                                  f"({cfg.fraction * total / 2**30:.1f} of {total / 2**30:.1f} GiB)")


def _check_cuda(switches: Switches, ctx: SetupContext) -> str | None:
    if switches.memory_fraction.fraction > 0 and ctx.device.type != "cuda":
        return f"memory_fraction caps CUDA memory; this run is on {ctx.device.type}"
    return None


OPTIMIZATION = Optimization(
    name="memory_fraction",
    config=MemoryFractionConfig,
    apply=apply_memory_fraction,
    enabled=lambda c: c.fraction > 0,
    addresses=(),
    effect="none on speed: it bounds this process's CUDA memory so other processes on the GPU keep "
           "the rest (or a run rehearses a smaller GPU)",
    cost="none per step",
    risk="out-of-memory errors below the device's real capacity; the allocator frees its cache and "
         "retries before it fails, which can slow steps near the cap",
    source="004 2.5",
    needs="CUDA",
    checks=(_check_cuda,),
)
