"""The vocabulary of glmperf, defined once: the phases of a step and the metrics of a run.

Everything that names a phase or a metric (the step timer's columns, the summary, the console
table, compare's thresholds, the reports' axes, the docs) reads these two tables. Adding a phase
is one line in `optimizers.vocabulary.StepPhase` (the lowest layer, since the switch catalog's
effects name phases too); adding a metric is one `Metric(...)` line in METRICS here
(docs/run-format.md, "The vocabulary").

A metric is read two ways: from a stored summary (`value`), and as one number per counted step
(`per_step`, over the rank-merged steady steps of `profiler.analysis.steps`), which is what the
comparison statistics sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from optimizers.vocabulary import StepPhase


@dataclass(frozen=True)
class Phase:
    """A part of the step the step timer times (steps.parquet column `<name>_s`)."""

    name: str
    description: str

    @property
    def column(self) -> str:
        return f"{self.name}_s"


PHASES: tuple[Phase, ...] = tuple(Phase(p.value, p.description) for p in StepPhase)
"""From optimizers.vocabulary.StepPhase, where the catalog's effects name them too."""
PHASE_NAMES: tuple[str, ...] = tuple(p.name for p in PHASES)
PHASE_COLUMNS: tuple[str, ...] = tuple(p.column for p in PHASES)
DERIVED_PHASES = ("comm", "other")
"""Phases the step timer computes rather than times: comm from the communication counters, other
as the remainder. A trainer phase with a name outside PHASES lands in other."""


def lookup(data: Mapping[str, Any], path: str) -> Any:
    """`data["a"]["b"]` for path "a.b"; None where any part is missing."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class Metric:
    """A figure of a run: its name (the key users type), unit, good direction and how to read it."""

    name: str
    label: str
    """For people, namespaced: `time/step p50`."""
    unit: str
    """The unit `value` returns, after `scale`."""
    better: str
    """"lower" or "higher": the direction of an improvement."""
    description: str
    summary_key: str
    """Dotted path of the stored figure in run.json's `summary`."""
    scale: float = 1.0
    """Stored value x scale = the value in `unit` (seconds to ms, bytes to GiB, share to %)."""
    per_step: Callable[[pd.DataFrame, Mapping[str, Any]], pd.Series] | None = None
    """One value per counted step, from the merged steady steps and the summary (None: a run-level
    figure only)."""
    digits: int = 1
    statistic: float = 0.5
    """The quantile of the per-step values a run's figure is (p90: 0.9; peak memory: 1.0, the max)."""
    speed: bool = True
    """Whether it measures speed (machine contention blurs it); memory and loss do not."""

    def value(self, summary: Mapping[str, Any]) -> float:
        raw = lookup(summary, self.summary_key)
        return float(raw) * self.scale if isinstance(raw, (int, float)) and raw is not None else math.nan

    def steps(self, steps: pd.DataFrame, summary: Mapping[str, Any]) -> pd.Series:
        """One value per step (`per_step`); a run-level figure has none to give."""
        if self.per_step is None:
            raise ValueError(f"{self.name} is a run-level figure: it has no value per step")
        return self.per_step(steps, summary)


def _tokens_per_s(steps: pd.DataFrame, summary: Mapping[str, Any]) -> pd.Series:
    return steps["tokens"] / steps["step_s"]


def _mfu_pct(steps: pd.DataFrame, summary: Mapping[str, Any]) -> pd.Series:
    capacity = (summary.get("peak_flops") or math.nan) * (summary.get("devices") or 1)
    return 100.0 * steps["tokens"] / steps["step_s"] * (summary.get("flops_per_token") or math.nan) / capacity


def _share_pct(phase: Phase) -> Callable[[pd.DataFrame, Mapping[str, Any]], pd.Series]:
    return lambda steps, summary: 100.0 * steps[phase.column] / steps["step_s"]


def _column(name: str, scale: float = 1.0) -> Callable[[pd.DataFrame, Mapping[str, Any]], pd.Series]:
    return lambda steps, summary: steps[name] * scale


METRICS: tuple[Metric, ...] = (
    Metric("step_time_p50", "time/step p50", "ms", "lower", "median step time of the slowest rank",
           "step_time_s.p50", 1e3, _column("step_s", 1e3)),
    Metric("step_time_p90", "time/step p90", "ms", "lower", "90th percentile step time", "step_time_s.p90", 1e3,
           _column("step_s", 1e3), statistic=0.9),
    Metric("step_time_p99", "time/step p99", "ms", "lower", "99th percentile step time", "step_time_s.p99", 1e3,
           _column("step_s", 1e3), statistic=0.99),
    Metric("tokens_per_s", "throughput", "tokens/s", "higher",
           "tokens of all ranks / time of the counted steps", "tokens_per_s", 1.0, _tokens_per_s, 0),
    Metric("mfu", "mfu", "%", "higher", "model FLOP/s over the devices' peak (PaLM appendix B)", "mfu", 100.0,
           _mfu_pct, 2),
    Metric("peak_memory", "memory/peak", "GiB", "lower",
           "CUDA max allocated, or on CPU the process RSS high-water mark", "peak_memory_bytes", 2**-30,
           _column("peak_memory_bytes", 2**-30), 2, statistic=1.0, speed=False),
    *(Metric(f"{p.name}_share", f"time/{p.name}", "%", "lower", f"share of the step: {p.description}",
             f"phase_share.{p.name}", 100.0, _share_pct(p)) for p in PHASES),
    Metric("loss_last", "loss/last", "", "lower", "loss of the last step (mean over ranks)", "loss_last", 1.0,
           _column("loss"), 4, speed=False),
    Metric("comm_bytes_per_step", "comm/bytes per step", "MiB", "lower", "payload of the step's collectives",
           "comm.bytes_per_step", 2**-20, None, 2),
    Metric("comm_overlap", "comm/overlapped", "%", "higher", "share of collective time hidden behind backward",
           "comm.overlap_share", 100.0, None),
    Metric("read_bytes_per_s", "io/read", "MiB/s", "lower", "storage bytes read by the process and its workers",
           "io.read_bytes_per_s", 2**-20, None, 2),
    Metric("straggler", "ranks/slowest over median", "x", "lower",
           "the slowest rank's median step over the median rank's", "straggler.slowest_over_median", 1.0, None, 3),
)
METRIC_BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def metric(name: str) -> Metric:
    """The metric called `name`; KeyError naming the known ones otherwise."""
    try:
        return METRIC_BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; known: {', '.join(METRIC_BY_NAME)}") from None
