"""The run summary: latency percentiles, phase shares, throughput, MFU, memory, communication, I/O.

Pure: data frames in, a dict out (stored as `summary` in run.json). Steps are first reduced
across ranks (a data-parallel step ends when its slowest rank does, so its time is the max over
ranks and its tokens the sum), then warmup steps (the first `warmup_steps`, compile steps, and
steps inside the torch.profiler window, whose overhead is not the run's) are excluded and said so.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

PHASES = ("data", "h2d", "forward", "backward", "optimizer", "comm", "checkpoint", "other")


def steady_steps(steps: pd.DataFrame, warmup_steps: int) -> tuple[pd.DataFrame, list[str]]:
    """Rows that represent the run's steady state, and the reasons rows were left out."""
    notes: list[str] = []
    if steps.empty:
        return steps, ["no steps were recorded"]
    first = int(steps["step"].min())
    keep = steps["step"] >= first + warmup_steps
    notes.append(f"first {warmup_steps} step(s) excluded as warmup")
    for column, why in (("warmup", "compile"), ("profiled", "inside the torch.profiler window")):
        if column in steps and steps[column].any():
            keep &= ~steps[column].astype(bool)
            notes.append(f"steps {why} excluded")
    if not keep.any():
        notes.append("too few steps for that: all steps used")
        return steps, notes
    return steps[keep], notes


def per_step(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per step: step time = slowest rank, tokens = all ranks."""
    agg: dict[str, Any] = {"step_s": "max", "tokens": "sum"}
    return steps.groupby("step").agg(agg)


def _pct(series: pd.Series, q: float) -> float:
    return float(series.quantile(q)) if len(series) else math.nan


def summarize(steps: pd.DataFrame, *, warmup_steps: int, flops_per_token: float,
              peak_flops: float, world_size: int = 1, samples: pd.DataFrame | None = None
              ) -> dict[str, Any]:
    """The summary dict of run.json (keys documented in docs/run-format.md)."""
    steady, notes = steady_steps(steps, warmup_steps)
    if steady.empty:
        return {"steps_counted": 0, "notes": notes}
    by_step = per_step(steady)
    total_time = float(by_step["step_s"].sum())
    tokens_per_s = float(by_step["tokens"].sum()) / total_time if total_time > 0 else math.nan
    mean_step = float(steady["step_s"].mean())
    loss = steps.groupby("step")["loss"].mean()  # ranks see different samples: their mean
    share = {p: float(steady[f"{p}_s"].mean()) / mean_step if f"{p}_s" in steady and mean_step > 0 else 0.0
             for p in PHASES}
    summary: dict[str, Any] = {
        "steps_counted": int(len(by_step)),
        "steps_total": int(steps["step"].nunique()),
        "notes": notes,
        "tokens_per_s": tokens_per_s,
        "step_time_s": {"mean": float(by_step["step_s"].mean()), "p50": _pct(by_step["step_s"], 0.5),
                        "p90": _pct(by_step["step_s"], 0.9), "p99": _pct(by_step["step_s"], 0.99),
                        "max": float(by_step["step_s"].max())},
        "phase_share": share,
        "flops_per_token": flops_per_token,
        "peak_flops": peak_flops,
        "achieved_flops": tokens_per_s * flops_per_token,
        "mfu": tokens_per_s * flops_per_token / (peak_flops * world_size) if peak_flops else math.nan,
        "loss_first": float(loss.iloc[0]),
        "loss_last": float(loss.iloc[-1]),
        "skipped_steps": int(steps["skipped"].sum()) if "skipped" in steps else 0,
    }
    summary.update(_memory(steps))
    summary.update(_comm(steady))
    summary.update(_io(steady, samples))
    if "rank" in steady and steady["rank"].nunique() > 1:
        by_rank = steady.groupby("rank")["step_s"].median()
        summary["straggler"] = {"slowest_rank": int(by_rank.idxmax()),
                                "slowest_over_median": float(by_rank.max() / by_rank.median())}
    return summary


def _memory(steps: pd.DataFrame) -> dict[str, Any]:
    cuda = steps.get("mem_alloc_peak_bytes")
    if cuda is not None and cuda.notna().any():
        return {"peak_memory_bytes": int(cuda.max()), "peak_memory_source": "torch.cuda.max_memory_allocated",
                "peak_reserved_bytes": int(steps["mem_reserved_peak_bytes"].max())}
    rss = steps.get("rss_peak_bytes", steps.get("rss_bytes"))
    if rss is not None and rss.notna().any():
        return {"peak_memory_bytes": int(rss.max()), "peak_memory_source": "process RSS (CPU)"}
    return {"peak_memory_bytes": None, "peak_memory_source": "not measured"}


def _comm(steady: pd.DataFrame) -> dict[str, Any]:
    if "comm_bytes" not in steady or not steady["comm_bytes"].fillna(0).any():
        return {}
    time_s = float(steady["comm_time_s"].sum())
    return {"comm": {
        "calls_per_step": float(steady["comm_calls"].mean()),
        "bytes_per_step": float(steady["comm_bytes"].mean()),
        "time_per_step_s": float(steady["comm_time_s"].mean()),
        "exposed_per_step_s": float(steady["comm_s"].mean()),
        "overlap_share": 1.0 - float(steady["comm_s"].sum()) / time_s if time_s > 0 else math.nan,
        "bandwidth_bytes_per_s": float(steady["comm_bytes"].sum()) / time_s if time_s > 0 else math.nan,
    }}


def _io(steady: pd.DataFrame, samples: pd.DataFrame | None) -> dict[str, Any]:
    """Data wait share of the step, and what the process and its loader workers read (CPU sampler)."""
    io: dict[str, Any] = {"data_wait_share": float(steady["data_s"].sum() / steady["step_s"].sum())}
    if samples is not None and not samples.empty and "io_read_bytes_per_s" in samples:
        s = samples.dropna(subset=["io_read_bytes_per_s"]).sort_values("ts")
        if len(s) >= 2:
            dt = s["ts"].diff().fillna(0.0)
            io.update(read_bytes=float((s["io_read_bytes_per_s"] * dt).sum()),
                      read_bytes_per_s=float(s["io_read_bytes_per_s"].mean()),
                      read_chars_per_s=float(s["io_read_chars_per_s"].mean()) if "io_read_chars_per_s" in s
                      else math.nan)
    return {"io": io}
