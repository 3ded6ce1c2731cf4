"""The machine the run measured: low-precision speed, cores against threads, clocks and throttling.

Figures:
- `native_bf16` (1 or 0): bf16 matmul hardware: a CPU with avx512_bf16 or amx_bf16, a CUDA GPU of
  compute capability 8.0+ (environment.cpu_flags / cuda_capability).
- `bf16_speedup`, `fp16_speedup` (x): how much faster the run's own heaviest matmul shapes run in
  bf16 / fp16 than in fp32 on this machine (run.json `shape_speedup`, measured when the run ended;
  the device's peak ratio where it was not measured); `bf16_peak_ratio`, `fp16_peak_ratio`: the
  device's peak ratio on big squares (run.json `matmul_peaks`); `run_dtype_speedup`: the speedup of
  the run's own dtype (1 for fp32).
- `cores`: CPU cores the process may use; `thread_demand`: torch threads + loader workers of all
  ranks on one host; `other_cpu_busy` (cores): what other processes kept busy meanwhile (CPU
  samples taken during the counted steps, all samples where none was): the machine's use less the
  ranks' own.
- `cpu_contention` (%): the share of the CPU the run's threads wanted (min(thread_demand, cores))
  that other processes took: per sample, the cores they kept busy beyond those the run left free,
  counted only while the machine was >= SATURATED % busy (else a core sat idle and nothing was
  taken), averaged, times the share of the step that computes (waiting for data is not slowed).
- `step_spread` (x): the step time's p90 over its p50 (summary.step_time_s).
- `throttled` (% of NVML samples inside steps with a power or thermal clocks-event reason),
  `sm_clock_drop` (% the median SM clock sits below the highest seen).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pandas as pd

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

HARMLESS_REASONS = {"", "gpu_idle", "applications_clocks_setting", "display_clock_setting"}
"""Clocks-event reasons that do not slow a busy GPU down."""
SATURATED = 95.0
"""% of the machine's CPU in use from which other processes take cores from the run (as compare's
contention; below it a core sat idle)."""


NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""CPU flags of bf16 matmul hardware (without one, torch emulates bf16 matmuls, many times slower)."""


def _native_bf16(env: Mapping[str, Any]) -> float:
    if str(env.get("device", "cpu")).startswith("cuda"):
        capability = env.get("cuda_capability")
        return float(float(capability) >= 8.0) if capability else math.nan
    flags = env.get("cpu_flags")
    return float(bool(NATIVE_BF16_FLAGS & set(flags))) if flags is not None else math.nan


def _speedups(run: RunData) -> Figures:
    """bf16/fp16 over fp32: at the run's own matmul shapes when measured (run.json `shape_speedup`,
    what a switch would give this model), else the device's peak ratio on big squares."""
    peaks, at_shapes = run.matmul_peaks, run.shape_speedup
    base = num(peaks.get("tf32", peaks.get("fp32")))
    out: Figures = {}
    for kind in ("bf16", "fp16"):
        if kind in peaks:
            out[f"{kind}_peak_ratio"] = Figure(num(peaks[kind]) / base, "x", f"run.json matmul_peaks.{kind} / fp32")
        if kind in at_shapes:
            out[f"{kind}_speedup"] = Figure(num(at_shapes[kind]), "x",
                                            f"run.json shape_speedup.{kind} (the run's heaviest matmul shapes)")
        elif kind in peaks:
            out[f"{kind}_speedup"] = out[f"{kind}_peak_ratio"]
    dtype = run.peak.get("dtype")
    if dtype in ("fp32", "tf32"):
        out["run_dtype_speedup"] = Figure(1.0, "x", "the run's matmuls are fp32")
    elif f"{dtype}_speedup" in out:
        speed, ratio = out[f"{dtype}_speedup"], out.get(f"{dtype}_peak_ratio")
        emulated = dtype == "bf16" and _native_bf16(run.environment) == 0.0
        if emulated and ratio is not None and ratio.value < speed.value:
            # every bf16 op is emulated here, backward and elementwise too, not only the forward matmuls
            # timed at the run's shapes (a tiny bf16 step ran 5x slower than fp32 where those timed 1.25x)
            speed = Figure(ratio.value, "x", f"{ratio.source} (no native bf16: all of its ops are emulated)")
        out["run_dtype_speedup"] = speed
    return out


def _cpu_samples(run: RunData) -> tuple[pd.DataFrame, str]:
    """The CPU samples taken during the counted steps (all of them where none was) and which they are;
    a sample whose interval was too short to measure (the machine's use read as 0.0) is left out."""
    s = run.samples.dropna(subset=["cpu_system_pct", "cpu_process_pct"])
    s = s[s["cpu_system_pct"] > 0]
    during = s[s["step"].isin(run.steady_steps.index)]
    if during.empty:
        return s, "samples.parquet (none in a counted step: all samples)"
    return during, "samples.parquet during the counted steps"


def _cpu(run: RunData, summary: Mapping[str, Any]) -> Figures:
    env = run.environment
    cores = num(env.get("cpu_affinity") or env.get("cpu_count"))
    per_host: Counter[str] = Counter()
    for r in run.ranks:
        if "torch_threads" in r:
            per_host[r.get("host", "")] += int(r["torch_threads"]) + int(r.get("loader_workers", 0))
    out: Figures = {"cores": Figure(cores, "cores", "environment.cpu_affinity")}
    if per_host:
        out["thread_demand"] = Figure(float(max(per_host.values())), "threads",
                                      "ranks[].torch_threads + loader_workers, per host")
    if run.samples.empty or not {"cpu_system_pct", "cpu_process_pct"} <= set(run.samples):
        return out  # no CPU sampler (a GPU's NVML samples, or the sampler off)
    s, where = _cpu_samples(run)
    if s.empty or math.isnan(cores):
        return out
    hosts = Counter(r.get("host", "") for r in run.ranks)
    on_host = s["rank"].map({r.get("rank"): hosts[r.get("host", "")] for r in run.ranks}).fillna(1)
    workers = s["cpu_workers_pct"].fillna(0.0) if "cpu_workers_pct" in s else 0.0
    own = (s["cpu_process_pct"] + workers) / 100 * on_host  # the ranks of a host taken alike
    others = s["cpu_system_pct"] / 100 * cores - own
    out["other_cpu_busy"] = Figure(max(0.0, float(others.mean())), "cores", f"{where}: cpu_system_pct - ours")
    wanted = max(1.0, min(max(per_host.values()) if per_host else cores, cores))
    taken = (others - (cores - wanted)).clip(lower=0.0, upper=wanted).where(s["cpu_system_pct"] >= SATURATED, 0.0)
    computing = 1 - num((summary.get("io") or {}).get("data_wait_share"))
    computing = 1.0 if math.isnan(computing) else min(1.0, max(0.0, computing))
    out["cpu_contention"] = Figure(100 * float(taken.mean()) / wanted * computing, "%",
                                   f"{where}: other processes' cores beyond those the run left free while the "
                                   f"machine was >= {SATURATED:g}% busy, over the {wanted:g} it wanted, x the "
                                   "share of the step not waiting for data")
    return out


def _spread(summary: Mapping[str, Any]) -> Figures:
    times = summary.get("step_time_s") or {}
    p50, p90 = num(times.get("p50")), num(times.get("p90"))
    return {"step_spread": Figure(p90 / p50, "x", "summary.step_time_s.p90 / p50")} if p50 > 0 else {}


def _clocks(run: RunData) -> Figures:
    s = run.samples
    if s.empty or "throttle" not in s:
        return {}
    busy = s[s["step"] >= 0]
    if busy.empty:
        return {}
    reasons = busy["throttle"].fillna("").map(lambda r: bool(set(r.split("|")) - HARMLESS_REASONS))
    clocks = busy["sm_clock_mhz"].dropna()
    out = {"throttled": Figure(100 * float(reasons.mean()), "%", "samples.parquet throttle")}
    if len(clocks):
        drop = 100 * (1 - float(clocks.median()) / float(clocks.max()))
        out["sm_clock_drop"] = Figure(drop, "%", "samples.parquet sm_clock_mhz")
    return out


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    out: Figures = {"native_bf16": Figure(_native_bf16(run.environment), "yes=1",
                                          "environment.cpu_flags / cuda_capability")}
    out.update(_speedups(run))
    out.update(_cpu(run, summary))
    out.update(_spread(summary))
    out.update(_clocks(run))
    return out
