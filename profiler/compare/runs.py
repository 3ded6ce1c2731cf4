"""Compare stored runs: baseline runs vs candidate runs, as the CLI gate, the reports and the dashboard
ask it. Pure over loaded runs (`profiler.analysis.load_run`): no I/O, no printing.

    result = compare([load_run(a)], [load_run(b)], make_gate())
    result.verdict            # regressed, improved, unchanged or inconclusive
    result.metrics            # per metric: figures, change, interval, p-value, verdict (profiler.compare.stats)
    result.phases, result.ops # where the step time went, largest change first
    result.differences        # config, device, threads and versions that differ between the sides

Steps are those the summary counts (`RunData.steady_steps`: ranks merged, warmup, compile and
profiled steps out). Phases are compared by their mean ms a step, which add up to the step time;
aten operators by their self time per profiled step (profiler.analysis.operators: the device's on
CUDA, the host's on CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from profiler.analysis import RunData, operators, summary_of
from profiler.compare.gate import DEFAULT_REPORTED, LOSS_PARITY, Gate, Threshold
from profiler.compare.stats import Estimate, Options, Parity, compare_series, discount_contention, loss_parity
from profiler.metrics import METRIC_BY_NAME, PHASES, flatten

TOP_OPS = 5
"""Metrics the machine's speed and other processes cannot move (the rest are speeds)."""
SATURATED = 0.95
"""Machine CPU use from which other processes' use counts as contention (below it, CPU sat idle)."""
PARITY_KEYS = ("model", "data", "train.seed", "train.batch_size")
"""Config that must agree for the loss curves to be comparable step by step..."""
PARITY_FREE = ("data.io_delay_ms", "data.cache_dir")
"""...except what changes when a batch arrives or where it is cached, not what it holds."""
WORKLOAD_KEYS = ("model", "data.seq_len")
"""Config that makes the work of a step: runs that differ in it train different models or shapes, and
their figures compare the workloads, not the code."""


@dataclass(frozen=True)
class MetricComparison:
    name: str
    label: str
    unit: str
    better: str
    threshold: Threshold
    estimate: Estimate


@dataclass(frozen=True)
class TimeChange:
    """A phase's or an operator's time per step on each side (ms)."""

    name: str
    base_ms: float
    cand_ms: float
    description: str = ""

    @property
    def change_ms(self) -> float:
        return self.cand_ms - self.base_ms


@dataclass(frozen=True)
class Difference:
    section: str
    """"config" or "environment"."""
    key: str
    base: Any
    cand: Any


@dataclass(frozen=True)
class Comparison:
    base: tuple[str, ...]
    cand: tuple[str, ...]
    metrics: tuple[MetricComparison, ...]
    parity: Parity
    parity_threshold: Threshold
    phases: tuple[TimeChange, ...]
    ops: tuple[TimeChange, ...]
    ops_time: str
    """What `ops` compares ("self device time", "self CPU time"), or why there are none."""
    differences: tuple[Difference, ...]
    across_devices: str | None
    contention: tuple[float | None, float | None]
    """Largest CPU contention over a side's runs (see `contention`; None: not measured, e.g. on a GPU)."""
    notes: tuple[str, ...]
    options: Options
    different_models: str | None = None
    """What the sides' models or shapes differ in (WORKLOAD_KEYS), e.g. "model.hidden_size 64 vs 512";
    None when every run trains the same."""

    @property
    def failures(self) -> tuple[str, ...]:
        """What fails the gate: gated metrics that regressed, and a gated loss drift."""
        out = [m.name for m in self.metrics if m.threshold.gated and m.estimate.verdict == "regressed"]
        if self.parity_threshold.gated and self.parity.verdict == "drift":
            out.append(LOSS_PARITY)
        return tuple(out)

    @property
    def verdict(self) -> str:
        """regressed if anything gated failed; else inconclusive, improved or unchanged (in that order)."""
        if self.failures:
            return "regressed"
        gated = {m.estimate.verdict for m in self.metrics if m.threshold.gated}
        return next((v for v in ("inconclusive", "improved") if v in gated), "unchanged")


def _settings(run: RunData) -> dict[str, dict[str, Any]]:
    """What a run was (config) and where it ran (environment and measured peak), flattened."""
    config = {k: v for k, v in flatten(run.config).items() if k != "name"}
    environment = flatten({**run.environment, "peak_flops": run.peak.get("flops")})
    return {"config": config, "environment": environment}


def _differences(a: dict[str, Any], b: dict[str, Any], section: str) -> list[Difference]:
    return [Difference(section, k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def contention(run: RunData, steady: pd.DataFrame) -> float | None:
    """How much other processes could have slowed the run's steady steps: the share of the machine's
    CPU they took beyond the cores the run left free (its ranks' torch threads fewer than the cores
    leave some), counted only while no CPU sat idle, and only for the part of the step that computes
    (waiting for input, a sleep or I/O, is not slowed by it: the data wait share is left out).

    From the CPU sampler, per sample: the whole machine's use less the ranks' own (ranks assumed
    alike and on one host); the median over the samples. None when not measured (e.g. on a GPU)."""
    s = run.samples
    if s.empty or "cpu_system_pct" not in s or steady.empty:
        return None
    s = s[s["step"].isin(steady.index)].dropna(subset=["cpu_system_pct", "cpu_process_pct"])
    if s.empty:
        return None
    env = run.environment
    cores = int(env.get("cpu_count") or 1)
    threads = int(env.get("cpu_threads") or cores) * run.world_size
    used = s["cpu_system_pct"] / 100
    own = (s["cpu_process_pct"] + s.get("cpu_workers_pct", 0.0)) / 100 * run.world_size / cores
    others = (used - own - (1 - min(threads, cores) / cores)).clip(lower=0)
    computing = 1 - float(steady["data_s"].sum() / steady["step_s"].sum())
    return float(others.where(used >= SATURATED, 0.0).median()) * computing


def _side_contention(runs: Sequence[RunData]) -> float | None:
    found = [x for r in runs if (x := contention(r, r.steady_steps)) is not None]
    return max(found) if found else None


def _phases(base: Sequence[pd.DataFrame], cand: Sequence[pd.DataFrame]) -> tuple[TimeChange, ...]:
    def side(frames: Sequence[pd.DataFrame], column: str) -> float:
        means = [1e3 * float(f[column].mean()) for f in frames if column in f and len(f)]
        return float(pd.Series(means).median()) if means else 0.0

    out = [TimeChange(p.name, side(base, p.column), side(cand, p.column), p.description) for p in PHASES]
    return tuple(sorted(out, key=lambda c: -abs(c.change_ms)))


def _op_times(run: RunData) -> pd.Series:
    """ms of self time per profiled step, by aten operator (profiler.analysis.operators)."""
    return operators.per_step(run).groupby("name")["time_s"].sum() * 1e3


def _ops(base: Sequence[RunData], cand: Sequence[RunData]) -> tuple[tuple[TimeChange, ...], str]:
    if any(r.ops.empty for side in (base, cand) for r in side):
        return (), "no operator table on a side (profile.trace off, or no step in its window)"
    on_cuda = all(r.on_cuda for side in (base, cand) for r in side)
    label = "self device time" if on_cuda else "self CPU time"
    b, c = (pd.concat([_op_times(r) for r in side], axis=1).fillna(0.0).median(axis=1) for side in (base, cand))
    both = pd.concat([b.rename("b"), c.rename("c")], axis=1).fillna(0.0)
    both = both.loc[(both["c"] - both["b"]).abs().sort_values(ascending=False).index[:TOP_OPS]]
    return tuple(TimeChange(str(n), float(r.b), float(r.c)) for n, r in both.iterrows()), label


def _loss_curve(merged: Sequence[pd.DataFrame]) -> pd.Series:
    return pd.concat([m["loss"] for m in merged if "loss" in m]).groupby(level=0).median()


def _parity(settings: Sequence[dict[str, dict[str, Any]]], merged: tuple[list[pd.DataFrame], list[pd.DataFrame]],
            tolerance: float) -> Parity:
    first = settings[0]["config"]
    differ = sorted({k for s in settings for k, v in s["config"].items()
                     if _in(k, PARITY_KEYS) and k not in PARITY_FREE
                     and first.get(k) != v})
    if differ:
        return Parity("not comparable", f"the runs differ in {', '.join(differ)}", tolerance)
    return loss_parity(_loss_curve(merged[0]), _loss_curve(merged[1]), tolerance=tolerance)


def _in(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def _values(side: Sequence[dict[str, dict[str, Any]]], key: str) -> str:
    return "/".join(dict.fromkeys(str(s["config"].get(key)) for s in side))


def _different_models(settings: tuple[list[dict[str, dict[str, Any]]], ...]) -> str | None:
    """The workload keys whose values are not the same in every run, each as "key base vs candidate"."""
    runs = [s["config"] for side in settings for s in side]
    keys = sorted({k for c in runs for k in c if _in(k, WORKLOAD_KEYS) and any(o.get(k) != c[k] for o in runs)})
    if not keys:
        return None
    return ", ".join(f"{k} {_values(settings[0], k)} vs {_values(settings[1], k)}" for k in keys)


def _across_devices(env: tuple[dict[str, Any], dict[str, Any]]) -> str | None:
    def device(e: dict[str, Any]) -> str:
        return f"{e.get('device')} ({e.get('device_name')})"

    if device(env[0]) == device(env[1]):
        return None
    return (f"across devices: baseline on {device(env[0])}, candidate on {device(env[1])}; the figures compare "
            "the devices as much as the code")


def _side_notes(label: str, runs: Sequence[RunData], settings: Sequence[dict[str, dict[str, Any]]]) -> list[str]:
    """Steps a side's runs left out for a rank's sake (the warmup, compile and profiled steps every run
    leaves out go unsaid), and what its runs differ in among themselves."""
    out = [f"{label} run {r.id}: {n}" for r in runs for n in r.merge_notes]
    for section in ("config", "environment"):
        differ = sorted({d.key for s in settings[1:] for d in _differences(settings[0][section], s[section], section)})
        if differ:
            out.append(f"the {label} runs differ among themselves in {section}: {', '.join(differ)}")
    return out


def compare(base: Sequence[RunData], cand: Sequence[RunData], gate: Gate) -> Comparison:
    """Baseline runs vs candidate runs (one or more each), against the gate's thresholds."""
    if not base or not cand:
        raise ValueError("compare needs at least one baseline and one candidate run")
    sides = (list(base), list(cand))
    settings = tuple([_settings(r) for r in runs] for runs in sides)
    names = tuple([r.id for r in runs] for runs in sides)
    summaries = tuple([summary_of(r) for r in runs] for runs in sides)
    busy = (_side_contention(sides[0]), _side_contention(sides[1]))
    metrics = []
    for threshold in gate.thresholds:
        if threshold.metric == LOSS_PARITY:
            continue
        m = METRIC_BY_NAME[threshold.metric]
        series = [[m.steps(r.steady_steps, summary).to_numpy() for r, summary in zip(runs, sm, strict=True)]
                  for runs, sm in zip(sides, summaries, strict=True)]
        estimate = compare_series(series[0], series[1], better=m.better, limit=threshold.limit,
                                  quantile=m.statistic, floor=gate.options.noise_floor(m.name),
                                  options=gate.options, unit=m.unit, speed=m.speed,
                                  names=(names[0], names[1]))
        if m.speed:
            estimate = discount_contention(estimate, base=busy[0], cand=busy[1], limit=gate.options.max_contention)
        metrics.append(MetricComparison(m.name, m.label, m.unit, m.better, threshold, estimate))
    parity_threshold = gate.threshold(LOSS_PARITY) or Threshold(LOSS_PARITY, DEFAULT_REPORTED[LOSS_PARITY], False)
    merged = ([r.merged_steps for r in sides[0]], [r.merged_steps for r in sides[1]])
    ops, ops_time = _ops(*sides)
    env = (settings[0][0]["environment"], settings[1][0]["environment"])
    notes = [n for label, i in (("baseline", 0), ("candidate", 1))
             for n in _side_notes(label, sides[i], settings[i])]
    return Comparison(
        base=tuple(names[0]), cand=tuple(names[1]), metrics=tuple(metrics),
        parity=_parity([*settings[0], *settings[1]], merged, parity_threshold.limit),
        parity_threshold=parity_threshold,
        phases=_phases([r.steady_steps for r in sides[0]], [r.steady_steps for r in sides[1]]), ops=ops,
        ops_time=ops_time,
        differences=tuple(_differences(settings[0][0]["config"], settings[1][0]["config"], "config")
                          + _differences(*env, "environment")),
        across_devices=_across_devices(env), contention=busy, notes=tuple(dict.fromkeys(notes)), options=gate.options,
        different_models=_different_models(settings))
