"""The run summary (run.json `summary`): latency percentiles, phase shares, throughput, MFU, memory,
communication and I/O, computed from a loaded run by pure functions.

`finalize` stores `summarize(load_run(dir))`; running it again on the same files gives the same
dict, so any stored run can be re-summarized (or summarized while it runs, or after a kill)
without the orchestrator. Keys: docs/run-format.md. Steps are the loaded run's steady view
(`RunData.steady_steps`: merged across ranks, then reduced to the steady state, profiler.analysis.steps).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from profiler.analysis.loader import RunData
from profiler.metrics import PHASES

NAN = math.nan


def _pct(series: pd.Series, q: float) -> float:
    return float(series.quantile(q)) if len(series) else NAN


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else NAN


def _live_note(run: RunData, counted: int) -> list[str]:
    status = run.recorded_status
    if status == "running":
        return [f"the run is still running: summary of the {counted} steady step(s) flushed so far"]
    if status == "incomplete":
        return [f"the run was killed (its process is gone, status incomplete): summary of the steps flushed "
                f"before it stopped; `glmperf finalize {run.path}` stores it"]
    return []


def summarize(run: RunData) -> dict[str, Any]:
    """The summary dict of run.json for `run` (keys documented in docs/run-format.md)."""
    merged, steady = run.merged_steps, run.steady_steps
    notes = [*run.merge_notes, *run.steady_notes]
    if steady.empty:
        return {"steps_counted": 0, "steps_total": int(merged.index.nunique()) if not merged.empty else 0,
                "notes": notes + _live_note(run, 0)}
    notes += _live_note(run, len(steady))
    total_time = float(steady["step_s"].sum())
    counted = total_time > 0 and bool(steady["tokens"].notna().any())  # imported traces do not know their tokens
    tokens_per_s = float(steady["tokens"].sum()) / total_time if counted else NAN
    mean_step = float(steady["step_s"].mean())
    peak = run.peak
    flops_per_token = _float(run.flops_per_token)
    if run.model.get("flops_source"):  # a user's own model: where its FLOPs/token (and MFU) come from
        notes.append(f"FLOPs per token (MFU): {run.model['flops_source']}")
    capacity = _float(peak.get("flops")) * devices(run)
    summary: dict[str, Any] = {
        "steps_counted": int(len(steady)),
        "steps_total": int(merged.index.nunique()),
        "notes": notes,
        "tokens_per_s": tokens_per_s,
        "step_time_s": {"mean": mean_step, "p50": _pct(steady["step_s"], 0.5), "p90": _pct(steady["step_s"], 0.9),
                        "p99": _pct(steady["step_s"], 0.99), "max": float(steady["step_s"].max())},
        "phase_share": {p.name: float(steady[p.column].mean()) / mean_step if p.column in steady and mean_step > 0
                        else 0.0 for p in PHASES},
        "flops_per_token": flops_per_token,
        "peak_flops": _float(peak.get("flops")),
        "peak_flops_source": peak.get("source", "not measured"),
        "peak_dtype": peak.get("dtype"),
        "devices": devices(run),
        "achieved_flops": tokens_per_s * flops_per_token,
        "mfu": tokens_per_s * flops_per_token / capacity if capacity > 0 else NAN,
        "loss_first": float(merged["loss"].iloc[0]),
        "loss_last": float(merged["loss"].iloc[-1]),
        "skipped_steps": int(merged["skipped"].sum()) if "skipped" in merged else 0,
        "peak_memory_bytes": float(merged["peak_memory_bytes"].max()),
        "peak_memory_source": run.memory_source,
    }
    if "mem_reserved_peak_bytes" in run.steps and run.steps["mem_reserved_peak_bytes"].notna().any():
        summary["peak_reserved_bytes"] = float(run.steps["mem_reserved_peak_bytes"].max())
    summary.update(_comm(steady))
    summary.update(_io(steady, run.samples))
    summary.update(_straggler(run.steps, steady))
    return summary


def devices(run: RunData) -> int:
    """How many devices the peak is counted for: one GPU per rank, or one CPU per host the ranks ran on."""
    if run.on_cuda:
        return run.world_size
    return max(1, len({r["host"] for r in run.ranks if r.get("host")}))


def _comm(steady: pd.DataFrame) -> dict[str, Any]:
    if "comm_bytes" not in steady or not steady["comm_bytes"].fillna(0).any():
        return {}
    time_s = float(steady["comm_time_s"].sum())
    return {"comm": {
        "calls_per_step": float(steady["comm_calls"].mean()),
        "bytes_per_step": float(steady["comm_bytes"].mean()),
        "time_per_step_s": float(steady["comm_time_s"].mean()),
        "exposed_per_step_s": float(steady["comm_s"].mean()),
        "overlap_share": 1.0 - float(steady["comm_s"].sum()) / time_s if time_s > 0 else NAN,
        "bandwidth_bytes_per_s": float(steady["comm_bytes"].sum()) / time_s if time_s > 0 else NAN,
    }}


def _io(steady: pd.DataFrame, samples: pd.DataFrame) -> dict[str, Any]:
    """Data wait share of the step, and what the ranks' processes and loader workers read (CPU sampler)."""
    io: dict[str, Any] = {"data_wait_share": float(steady["data_s"].sum() / steady["step_s"].sum())}
    if samples.empty or "io_read_bytes_per_s" not in samples:
        return {"io": io}
    read = chars = rate = 0.0
    measured = False
    for _, s in samples.dropna(subset=["io_read_bytes_per_s"]).sort_values("ts").groupby("rank"):
        if len(s) < 2:
            continue
        measured = True
        dt = s["ts"].diff().fillna(0.0)
        read += float((s["io_read_bytes_per_s"] * dt).sum())
        rate += float(s["io_read_bytes_per_s"].mean())
        chars += float(s["io_read_chars_per_s"].mean()) if "io_read_chars_per_s" in s else NAN
    if measured:
        io.update(read_bytes=read, read_bytes_per_s=rate, read_chars_per_s=chars)
    return {"io": io}


def _straggler(steps: pd.DataFrame, steady: pd.DataFrame) -> dict[str, Any]:
    rows = steps[steps["step"].isin(steady.index)]
    if rows["rank"].nunique() < 2:
        return {}
    by_rank = rows.groupby("rank")["step_s"].median()
    critical = steady["critical_rank"].value_counts(normalize=True)
    return {"straggler": {"slowest_rank": int(by_rank.idxmax()),
                          "slowest_over_median": float(by_rank.max() / by_rank.median()),
                          "critical_share": {str(int(r)): float(v) for r, v in critical.items()}}}
