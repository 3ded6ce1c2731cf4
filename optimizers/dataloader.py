"""DataLoader options: worker processes, pinned memory, prefetch depth (000 4.2, ch.5; 004 2.3).

Workers load and collate batches in other processes while the step computes, so a slow input
pipeline (decoding, disk, `data.io_delay_ms`) hides behind compute as long as
num_workers x compute time covers one batch's load time. Batches stay a pure function of
(seed, step), so the losses do not depend on the worker count. Pinned (page-locked) host batches
let the host-to-device copy run asynchronously (the trainer then copies with non_blocking=True);
that needs a CUDA device: on CPU there is no copy to overlap. The trainer iterates one endless
loader, so workers start once per run either way: persistent_workers matters only to loaders
re-iterated per epoch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck, Capability


@dataclass
class DataLoaderConfig(Section):
    KEY: ClassVar[str] = "switches.dataloader"
    num_workers: int = 0
    """Loader worker processes (0 = load in the training process)."""
    pin_memory: bool = False
    """Page-locked host batches, so host-to-device copies can run async (CUDA only)."""
    prefetch_factor: int = 2
    """Batches each worker keeps ready (workers > 0 only)."""
    persistent_workers: bool = False
    """Keep workers alive across epochs instead of re-forking them."""

    def __post_init__(self) -> None:
        self.check_range("num_workers", lo=0, hi=1024)
        self.check_range("prefetch_factor", lo=1, hi=1024)


def loader_options(cfg: DataLoaderConfig) -> dict[str, Any]:
    """DataLoader keyword arguments; the worker-only ones only when there are workers (torch refuses
    prefetch_factor and persistent_workers with num_workers=0)."""
    options: dict[str, Any] = {"num_workers": cfg.num_workers, "pin_memory": cfg.pin_memory}
    if cfg.num_workers > 0:
        options.update(prefetch_factor=cfg.prefetch_factor, persistent_workers=cfg.persistent_workers)
    return options


def apply_dataloader(setup: TrainSetup, cfg: DataLoaderConfig, ctx: SetupContext) -> None:
    setup.loader_options = loader_options(cfg)
    said = [f"{cfg.num_workers} workers" + (f", prefetch {cfg.prefetch_factor} batches each"
                                            if cfg.num_workers else " (loads in the training process)")]
    if cfg.pin_memory:
        said.append("pinned memory" if ctx.device.type == "cuda"
                    else "pin_memory on a CPU device: nothing to overlap, it only costs a copy")
    if cfg.num_workers == 0 and (cfg.prefetch_factor != DataLoaderConfig.prefetch_factor
                                 or cfg.persistent_workers):
        said.append("prefetch_factor/persistent_workers ignored without workers")
    cpus = os.cpu_count() or 1
    if cfg.num_workers >= cpus:
        said.append(f"{cfg.num_workers} workers on {cpus} CPUs compete with the training process")
    setup.note("dataloader", "; ".join(said))


OPTIMIZATION = Optimization(
    name="dataloader",
    config=DataLoaderConfig,
    apply=apply_dataloader,
    enabled=lambda c: c != DataLoaderConfig(),
    addresses=(Bottleneck.INPUT_BOUND,),
    effect="workers hide the input pipeline's time behind compute, up to num_workers batches loading at "
           "once; pinned memory makes host-to-device copies asynchronous (CUDA).",
    cost="each worker is a process (its memory, a CPU core); prefetching holds "
         "num_workers x prefetch_factor batches in host memory; worker start-up delays the first batch.",
    risk="too many workers starve the training process of CPU; a batch-size change (dynamic_batch) "
         "reaches the trainer only after the prefetched batches.",
    source="000 4.2, ch.5; 004 2.3",
    candidates=(
        Candidate(set={"switches.dataloader.num_workers": 2}, applies=lambda c: c.num_workers == 0,
                  requires=(Capability.SPARE_CORES,),
                  effects=(Effect("data", "shrinks", 0.8, 1.0,
                                  basis="io_delay 20 ms, dataloader workers 2 row: data wait 21 -> 2 ms per step "
                                        "(-90%); docs/optimizations.md: 290 -> 24-47 ms on tiny"),),
                  note="workers hide at most the input time, while compute covers it"),
        Candidate(set={"switches.dataloader.pin_memory": True}, applies=lambda c: not c.pin_memory,
                  requires=(Capability.CUDA,),
                  effects=(Effect("h2d", "shrinks", 0.5, 0.9,
                                  basis="reasoning, not measured here (no GPU): a pinned batch is copied "
                                        "asynchronously (non_blocking) at the full link rate; a pageable one "
                                        "is staged through a pinned buffer while the host waits"),)),
    ),
)
