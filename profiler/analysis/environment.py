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
  ranks on one host; `other_cpu_busy` (cores): what other processes kept busy meanwhile (samples).
- `throttled` (% of NVML samples inside steps with a power or thermal clocks-event reason),
  `sm_clock_drop` (% the median SM clock sits below the highest seen).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

HARMLESS_REASONS = {"", "gpu_idle", "applications_clocks_setting", "display_clock_setting"}
"""Clocks-event reasons that do not slow a busy GPU down."""


def _native_bf16(env: Mapping[str, Any]) -> float:
    if str(env.get("device", "cpu")).startswith("cuda"):
        capability = env.get("cuda_capability")
        return float(float(capability) >= 8.0) if capability else math.nan
    flags = env.get("cpu_flags")
    return float(bool({"avx512_bf16", "amx_bf16"} & set(flags))) if flags is not None else math.nan


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


def _cpu(run: RunData) -> Figures:
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
    s = run.samples
    if not s.empty and "cpu_system_pct" in s and s["cpu_system_pct"].notna().any():
        ours = s.groupby("rank")[["cpu_process_pct", "cpu_workers_pct"]].mean().sum().sum() / 100
        others = float(s["cpu_system_pct"].mean()) / 100 * cores - float(ours)
        out["other_cpu_busy"] = Figure(max(0.0, others), "cores", "samples.parquet cpu_system_pct - ours")
    return out


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
    out.update(_cpu(run))
    out.update(_clocks(run))
    return out
