"""What a comparison checks: the gated thresholds, the metrics shown beside them, and the statistics'
options, from the defaults, a project's gate file (YAML) and `--metric NAME:THRESHOLD`.

A threshold is a relative change in the metric's bad direction: `step_time_p50:+5%` (slower is
worse), `tokens_per_s:-5%` (fewer is worse); an unsigned `5%` means the bad direction. The names are
the metric registry's (profiler.metrics) that have per-step values, plus `loss_parity`, whose
threshold is the loss curves' tolerance. A gate file (docs/ci.md):

    metrics: {step_time_p50: +5%, tokens_per_s: -5%, peak_memory: +10%}   # gated (replace the defaults)
    report: {step_time_p90: +10%}      # compared and shown, never failing
    confidence: 0.99                   # and run_noise, noise_per_spread, min_steps, min_runs, bootstrap, seed
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from profiler.compare.stats import DEFAULT_RUN_NOISE, Options
from profiler.metrics import METRIC_BY_NAME, METRICS

LOSS_PARITY = "loss_parity"
"""The loss curves at equal steps (same seed and data): a numerics check, not a speed one."""
COMPARABLE: tuple[str, ...] = (*(m.name for m in METRICS if m.per_step is not None), LOSS_PARITY)
DEFAULT_GATED: Mapping[str, float] = {"step_time_p50": 0.05, "tokens_per_s": 0.05, "peak_memory": 0.10}
DEFAULT_REPORTED: Mapping[str, float] = {"step_time_p90": 0.10, "mfu": 0.05, "data_share": 0.10,
                                         "comm_share": 0.10, LOSS_PARITY: 0.01}
"""The statistic of a run's steps that is its figure (default: the median)."""
_PERCENT = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)%$")
_OPTION_KEYS = tuple(f.name for f in fields(Options))


class GateError(ValueError):
    """A threshold, gate file or option that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Threshold:
    metric: str
    limit: float
    """Relative change in the bad direction allowed (0.05); for loss_parity, the tolerance."""
    gated: bool = True

    @property
    def text(self) -> str:
        """As a user writes it: +5%, -5%."""
        sign = "" if self.metric == LOSS_PARITY else "-" if METRIC_BY_NAME[self.metric].better == "higher" else "+"
        return f"{sign}{100 * self.limit:g}%"


@dataclass(frozen=True)
class Gate:
    thresholds: tuple[Threshold, ...]
    options: Options = field(default_factory=Options)

    @property
    def gated(self) -> tuple[Threshold, ...]:
        return tuple(t for t in self.thresholds if t.gated)

    def threshold(self, metric: str) -> Threshold | None:
        return next((t for t in self.thresholds if t.metric == metric), None)


def _metric_name(name: str) -> str:
    if name not in COMPARABLE:
        raise GateError(f"unknown metric {name!r}; known: {', '.join(COMPARABLE)}")
    return name


def parse_limit(metric: str, value: Any) -> float:
    """'+5%' -> 0.05 for `metric`, checking that the sign is the metric's bad direction."""
    match = _PERCENT.match(str(value).strip()) if isinstance(value, str) else None
    if match is None:
        raise GateError(f"threshold of {metric} must be a percentage such as +5% or -5%, got {value!r}")
    sign, limit = match.group(1), float(match.group(2)) / 100
    if metric == LOSS_PARITY:
        if sign == "-":
            raise GateError(f"{LOSS_PARITY} takes a tolerance such as 1%, got {value!r}")
        return limit
    better = METRIC_BY_NAME[metric].better
    bad = "+" if better == "lower" else "-"
    if sign and sign != bad:
        raise GateError(f"{metric} is better {better}: its threshold is a change in the bad direction, "
                        f"e.g. {metric}:{bad}{100 * limit:g}%")
    if better == "higher" and limit >= 1:
        raise GateError(f"threshold of {metric} must be a drop under 100%, got {value!r}")
    return limit


def parse_threshold(text: str, *, gated: bool = True) -> Threshold:
    """'step_time_p50:+5%' -> Threshold."""
    name, sep, value = text.partition(":")
    if not sep:
        raise GateError(f"--metric takes NAME:THRESHOLD such as step_time_p50:+5%, got {text!r}")
    name = _metric_name(name.strip())
    return Threshold(name, parse_limit(name, value), gated)


def _section(data: Any, key: str, source: str, *, gated: bool) -> list[Threshold]:
    if not isinstance(data, Mapping):
        raise GateError(f"{source}: `{key}` must map metric names to thresholds, e.g. step_time_p50: +5%")
    return [Threshold(_metric_name(str(n)), parse_limit(str(n), v), gated) for n, v in data.items()]


def _options(data: Mapping[str, Any], source: str, run_noise: float | None) -> Options:
    values: dict[str, Any] = {k: data[k] for k in _OPTION_KEYS if k in data}
    noise = values.get("run_noise", {})
    if isinstance(noise, (int, float)) and not isinstance(noise, bool):
        noise = {"default": noise}
    if not isinstance(noise, Mapping):
        raise GateError(f"{source}: run_noise must be a number or a mapping of metric to number")
    noise = {**DEFAULT_RUN_NOISE, **noise, **({"default": run_noise} if run_noise is not None else {})}
    for name, v in noise.items():
        if name != "default":
            _metric_name(str(name))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise GateError(f"{source}: run_noise of {name} must be a number, got {v!r}")
    values["run_noise"] = noise
    try:
        return Options(**values)
    except (TypeError, ValueError) as exc:
        raise GateError(f"{source}: {exc}") from None


def make_gate(file_data: Any = None, *, source: str = "gate file", metrics: Sequence[str] = (),
              run_noise: float | None = None, confidence: float | None = None) -> Gate:
    """The gate from a gate file's parsed YAML (or None), then the command line's --metric, --run-noise
    and --confidence on top (a --metric replaces the same metric's threshold, adds any other)."""
    data: Mapping[str, Any] = {} if file_data is None else file_data
    if not isinstance(data, Mapping):
        raise GateError(f"{source}: expected a mapping with `metrics`, `report` and options, got {type(data).__name__}")
    unknown = sorted(set(data) - {"metrics", "report", *_OPTION_KEYS})
    if unknown:
        raise GateError(f"{source}: unknown key(s) {', '.join(map(str, unknown))}; known: metrics, report, "
                        f"{', '.join(_OPTION_KEYS)}")
    gated = _section(data["metrics"], "metrics", source, gated=True) if "metrics" in data else \
        [Threshold(n, v) for n, v in DEFAULT_GATED.items()]
    reported = _section(data["report"], "report", source, gated=False) if "report" in data else \
        [Threshold(n, v, gated=False) for n, v in DEFAULT_REPORTED.items()]
    chosen = {t.metric: t for t in [*reported, *gated, *(parse_threshold(m) for m in metrics)]}
    if confidence is not None:
        data = {**data, "confidence": confidence}
    ordered = sorted(chosen.values(), key=lambda t: not t.gated)  # gated first, each in its given order
    return Gate(thresholds=tuple(ordered), options=_options(data, source, run_noise))
