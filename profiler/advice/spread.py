"""How much a fresh run of one config moves from run to run on this machine: what an expected range must
leave room for.

A probe measures a change side by side in one process over seconds; the user's next run is another
process, minutes later. On a shared or virtual machine two fresh runs of the same config differ by
several percent (on 2 vCPUs of an Intel Xeon: four bf16 runs of `small` at 78 to 89 us per token, one
after another), which no probe sees. So every verification (`glmperf recommend --verify`, `glmperf
tune`) keeps what its repeated runs showed: per metric, the pooled variance of log(value) within each
group of runs of one config. An expected range is then the probe's interval widened by this machine's
spread (profiler.advice.measured), and a probe stops adding rounds once it is narrower than that
spread. Until verifications have measured a machine, a prior stands in (PRIOR_SIGMA, weighing as PRIOR_DOF
degrees of freedom, pooled with what was measured): a range as if fresh runs never varied promises what
no run keeps, and a sigma from one verification's handful of runs can be far too small.

Kept in $GLMPERF_CACHE/spread/<machine>.json (the device, its name and ISA flags), the last GROUPS groups.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.analysis import RunData, summary_of
from profiler.instruments.machine import cache_dir, cpu_flags, device_name
from profiler.metrics import METRIC_BY_NAME, lookup
from profiler.store.files import StoreError, write_json_atomic

if TYPE_CHECKING:
    import torch

METRICS = ("tokens_per_s", "peak_memory")
GROUPS = 64
"""Groups kept per metric: recent verifications speak for the machine as it is now."""
PRIOR_SIGMA = 0.05
"""The spread assumed before a machine is measured: about the middle of what verifications measured on the
machines glmperf is developed on (sigma of log(tokens/s) 1.1% to 4.2% on 2 vCPUs of a quiet Intel Xeon,
7.3% to 14.3% on 2 vCPUs of an AMD EPYC: docs/BENCHMARKS.md section 7)."""
PRIOR_DOF = 4
"""The prior's weight, in degrees of freedom: two verifications of 3 runs a side outweigh it."""


@dataclass(frozen=True)
class Spread:
    """One fresh run's spread of a metric on this machine."""

    sigma: float
    """Standard deviation of log(value) of one run: about the relative spread (0.04: 4%)."""
    runs: int
    """Runs measured on this machine (0: the prior alone)."""
    groups: int

    def as_json(self) -> dict[str, float | int]:
        """What `expected.run_to_run` says of it."""
        return {"sigma_pct": round(100 * self.sigma, 2), "runs": self.runs,
                "prior_sigma_pct": round(100 * PRIOR_SIGMA, 2), "prior_dof": PRIOR_DOF}

    def text(self) -> str:
        """The spread as a range's basis says it."""
        sigma = f"{100 * self.sigma:.1f}%"
        if not self.runs:
            return f"{sigma} assumed (not measured on this machine yet: a verification measures it)"
        return f"{sigma} over {self.runs} runs (with a {100 * PRIOR_SIGMA:.0f}% prior as {PRIOR_DOF} runs)"


def _file(device: torch.device | str) -> Path | None:
    """This machine's spread file for `device`; None for a GPU this machine does not have."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return None
    who = json.dumps([device.type, device_name(device), cpu_flags()])
    return cache_dir() / "spread" / f"{hashlib.sha256(who.encode()).hexdigest()[:16]}.json"


def _read(path: Path | None) -> dict[str, list[list[float]]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
        kept = {m: [[float(ss), float(dof)] for ss, dof in data.get(m, [])] for m in METRICS}
        return {m: [g for g in groups if g[0] >= 0 and g[1] > 0] for m, groups in kept.items()}  # NaN: out
    except (OSError, ValueError, TypeError, AttributeError):
        return {m: [] for m in METRICS}


def record(groups: Mapping[str, Sequence[Sequence[float]]], device: torch.device | str) -> None:
    """Keep each group of repeated runs' values (metric -> groups of one config's per-run values); a group
    of fewer than two finite positive values says nothing and is skipped. An unwritable cache only
    loses the observation."""
    path = _file(device)
    if path is None:
        return
    kept = _read(path)
    for metric, values in groups.items():
        for group in values:
            logs = [math.log(x) for x in group if math.isfinite(x) and x > 0]
            if len(logs) >= 2:
                mean = sum(logs) / len(logs)
                kept[metric].append([sum((x - mean) ** 2 for x in logs), len(logs) - 1])
        kept[metric] = kept[metric][-GROUPS:]
    with contextlib.suppress(OSError, StoreError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, kept)


def record_runs(groups: Iterable[Sequence[RunData]]) -> None:
    """Keep what each group of fresh runs of one config (a verification's baseline, each candidate)
    showed; only completed runs count, and a traced run is grouped apart (the profiler holds memory)."""
    done = [[r for r in g if r.status == "completed" and bool(lookup(r.config, "profile.trace")) == traced]
            for g in groups for traced in (False, True)]
    done = [g for g in done if len(g) >= 2]
    if done:
        record({m: [[METRIC_BY_NAME[m].value(summary_of(r)) for r in g] for g in done] for m in METRICS},
               done[0][0].device)


def run_to_run(metric: str, device: torch.device | str) -> Spread:
    """The pooled spread of `metric` over this machine's recorded groups and the prior (the posterior mean
    of the variance under a scaled inverse chi-square prior)."""
    groups = _read(_file(device)).get(metric, [])
    dof = sum(d for _, d in groups)
    variance = (sum(ss for ss, _ in groups) + PRIOR_DOF * PRIOR_SIGMA**2) / (dof + PRIOR_DOF)
    return Spread(math.sqrt(variance), runs=int(dof + len(groups)), groups=len(groups))
