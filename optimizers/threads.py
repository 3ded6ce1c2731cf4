"""CPU threads: how many threads torch's operators use (`torch.set_num_threads`).

torch starts one intra-op thread per CPU the process may use. Two things a careful engineer tries on a
CPU: leaving cores to the loader's worker processes (threads and workers beyond the cores make both wait
on the scheduler), and one thread per physical core where SMT gives each core two logical CPUs (two
threads on one core share its vector units). Neither has a gain a model predicts: it depends on how busy
the workers are and how the kernels use the cores, so only a probe on the run's own model advises it.

Always applied: a count of 0 sets the process's own default again, so a run that follows another in one
process (verify, sweep, tune cells) never inherits its threads.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from optimizers.base import Optimization, SetupContext, TrainSetup
from optimizers.config import Section
from optimizers.facts import Candidate, Derived, no_modelled_gain
from optimizers.vocabulary import Bottleneck


@dataclass
class ThreadsConfig(Section):
    KEY: ClassVar[str] = "switches.threads"
    count: int = 0
    """torch's intra-op threads; 0 keeps the process's default (one per CPU it may use, or OMP_NUM_THREADS)."""

    def __post_init__(self) -> None:
        self.check_range("count", lo=0, hi=4096)


@functools.cache
def process_default() -> int:
    """torch's thread count the first time a setup asked: the process's default, before any switch set it."""
    import torch

    return torch.get_num_threads()


def apply_threads(setup: TrainSetup, cfg: ThreadsConfig, ctx: SetupContext) -> None:
    import torch

    default = process_default()
    torch.set_num_threads(cfg.count or default)
    setup.note("threads", f"{torch.get_num_threads()} torch threads" +
               ("" if cfg.count else " (the process's default)"))


def _cpus() -> set[int]:
    """The CPUs this process may run on (its affinity), which torch's default follows."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    """How many CPUs this process may run on."""
    return len(_cpus())


def physical_cores() -> int:
    """The distinct physical cores among the usable CPUs (Linux topology); the CPUs themselves where unknown."""
    cpus = _cpus()
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topology / "physical_package_id").read_text().strip() + ":" +
                      (topology / "core_id").read_text().strip())
        except OSError:
            return len(cpus)
    return len(cores)


def _beside_workers(workers: int) -> int:
    """Threads that leave one core to each loader worker (0: no workers, torch's default stands)."""
    return max(1, usable_cpus() - workers) if workers > 0 else 0


def _per_core() -> int:
    """One thread per physical core where SMT doubles the CPUs (0: no SMT, torch's default stands)."""
    cores = physical_cores()
    return cores if cores < usable_cpus() else 0


_PROBED = no_modelled_gain("measured, not modelled: the gain depends on how busy the workers are and how the "
                           "kernels use the cores")

OPTIMIZATION = Optimization(
    name="threads",
    config=ThreadsConfig,
    apply=apply_threads,
    enabled=lambda c: c.count > 0,
    always=True,
    addresses=(Bottleneck.CPU_OVERSUBSCRIBED, Bottleneck.COMPUTE_BOUND),
    effect="fewer threads than CPUs leave cores to the loader's workers, or one thread per physical core "
           "where two logical CPUs share one",
    cost="fewer threads for torch's operators: a compute-bound step on cores nothing else uses gets slower",
    risk="none to the numerics beyond reduction order; a count above the cores oversubscribes them",
    source="ours: the loader's workers (000 4.2, 004 2.3) compete with torch's threads for the cores",
    needs="a CPU run (on a GPU the host threads only launch kernels)",
    candidates=(
        Candidate(set={"switches.threads.count": Derived(("switches.dataloader.num_workers",), _beside_workers)},
                  applies=lambda c: c.count == 0, effects=_PROBED,
                  note="one core left to each loader worker: which is faster depends on how busy they are, so only "
                       "a probe on the run's own model advises it"),
        Candidate(set={"switches.threads.count": Derived((), _per_core)}, applies=lambda c: c.count == 0,
                  effects=_PROBED,
                  note="one thread per physical core: whether SMT's second thread helps depends on the kernels, so "
                       "only a probe on the run's own model advises it"),
    ),
)
