"""Figures of what the machine did during a run: device or CPU samples aligned to steps, the input
pipeline, communication between ranks, and the heaviest operators. Stored run in, plotly figure out
(None when the run measured nothing of the kind).

Samples are placed on the step axis: step k spans [k, k+1) between the end of step k-1 and the
end of step k (the latest rank's `ts_end`), so a sample lines up with the step it was taken in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiler import analysis
from profiler.analysis import HARMLESS_REASONS, RunData, collectives_by_rank
from profiler.metrics import METRIC_BY_NAME
from reports.plotting import axis, figure, with_caption

MIB, GIB = 2**20, 2**30

CPU_ROWS = (
    ("CPU (% of one core)", (("cpu_process_pct", "process", 1.0), ("cpu_workers_pct", "loader workers", 1.0))),
    ("machine CPU (% of all cores)", (("cpu_system_pct", "whole machine", 1.0),)),
    ("RSS (GiB)", (("rss_bytes", "process", 1 / GIB), ("rss_workers_bytes", "workers", 1 / GIB))),
    ("storage I/O (MiB/s)", (("io_read_bytes_per_s", "read", 1 / MIB), ("io_write_bytes_per_s", "write", 1 / MIB))),
)
NVML_ROWS = (
    ("utilization (%)", (("gpu_util_pct", "SM busy", 1.0), ("mem_util_pct", "memory busy", 1.0))),
    ("power (W)", (("power_w", "power", 1.0), ("power_limit_w", "limit", 1.0))),
    ("clocks (MHz)", (("sm_clock_mhz", "SM", 1.0), ("mem_clock_mhz", "memory", 1.0))),
)
"""(row title with unit, ((samples.parquet column, legend name, scale), ...)) of each subplot row."""
MANY_RANKS = 4
"""Past this many ranks a bar per rank and kind is too thin to read and its colors too many to tell apart."""


def step_position(run: RunData, ts: pd.Series) -> pd.Series:
    """Where on the step axis each timestamp falls (NaN outside the recorded steps)."""
    steps = run.steps
    if steps.empty or ts.empty:
        return pd.Series(np.nan, index=ts.index)
    ends = steps.groupby("step")["ts_end"].max().sort_index()
    first = steps[steps["step"] == ends.index[0]]
    start = float((first["ts_end"] - first["step_s"]).min())
    xp = np.concatenate([[start], ends.to_numpy()])
    fp = np.concatenate([[ends.index[0]], ends.index.to_numpy() + 1]).astype(float)
    pos = np.interp(ts.to_numpy(dtype=float), xp, fp)
    return pd.Series(np.where((ts >= xp[0]) & (ts <= xp[-1]), pos, np.nan), index=ts.index)


def _groups(samples: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Samples split by rank (CPU) or device (NVML), for one line each."""
    key = "device" if (samples["source"] != "cpu").any() else "rank"
    label = "GPU" if key == "device" else "rank"
    return [(f"{label} {int(k)}", rows) for k, rows in samples.groupby(key)]


def device_samples(run: RunData) -> go.Figure | None:
    """The sampler's readings over the steps: NVML utilization, power, clocks and throttling on a GPU;
    CPU use, memory and storage I/O of the process and its workers on a CPU."""
    samples = run.samples
    if samples.empty or "ts" not in samples:
        return None
    samples = samples.assign(x=step_position(run, samples["ts"])).dropna(subset=["x"]).sort_values("ts")
    if samples.empty:
        return None
    nvml = (samples["source"] != "cpu").any()
    rows = [r for r in (NVML_ROWS if nvml else CPU_ROWS) if any(c in samples for c, _, _ in r[1])]
    throttle = nvml and "throttle" in samples
    titles = [t for t, _ in rows] + (["throttling (harmful clocks-event reasons)"] if throttle else [])
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.06)
    many = len(_groups(samples)) > 1
    for i, (_, columns) in enumerate(rows, 1):
        for column, name, scale in columns:
            if column not in samples or samples[column].isna().all():
                continue
            for group, s in _groups(samples):
                fig.add_scatter(x=s["x"], y=s[column] * scale, mode="lines", row=i, col=1,
                                name=f"{name}, {group}" if many else name,
                                hovertemplate=f"{name}: %{{y:.2f}} at step %{{x:.1f}}<extra></extra>")
    if throttle:
        reasons = samples["throttle"].fillna("").map(lambda r: "|".join(sorted(set(r.split("|")) - HARMLESS_REASONS)))
        fig.add_scatter(x=samples["x"], y=(reasons != "").astype(int), mode="markers", name="throttled",
                        text=reasons, row=len(titles), col=1, hovertemplate="%{text} at step %{x:.1f}<extra></extra>")
    fig.update_xaxes(title_text="step", row=len(titles), col=1)
    source = "NVML, per GPU" if nvml else "psutil: the process and its loader workers (no NVML on this run)"
    hz = run.sampling.get("hz")
    return with_caption(fig, "Device samples", f"The sampler's readings ({source}, {hz} Hz) placed on the step "
                        "they were taken in.", height=180 * len(titles) + 80)


def data_wait(run: RunData, summary: Mapping[str, Any]) -> go.Figure | None:
    """How long each step waited for its batch, and what the process and its workers read meanwhile."""
    steps = run.steps
    if steps.empty:
        return None
    samples = run.samples
    has_io = not samples.empty and "io_read_bytes_per_s" in samples and samples["io_read_bytes_per_s"].notna().any()
    fig = make_subplots(rows=2 if has_io else 1, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["data wait (ms per step)"] + (["read throughput (MiB/s)"] if has_io else []))
    for rank, rows in steps.sort_values("step").groupby("rank"):
        fig.add_bar(x=rows["step"], y=rows["data_s"] * 1e3, name=f"data wait, rank {int(rank)}", row=1, col=1,
                    hovertemplate="step %{x}: %{y:.2f} ms<extra></extra>")
    if has_io:
        s = samples.assign(x=step_position(run, samples["ts"])).dropna(subset=["x"]).sort_values("ts")
        for column, name in (("io_read_bytes_per_s", "from storage"), ("io_read_chars_per_s", "read() calls")):
            if column in s:
                for rank, rows in s.groupby("rank"):
                    fig.add_scatter(x=rows["x"], y=rows[column] / MIB, mode="lines", row=2, col=1,
                                    name=f"{name}, rank {int(rank)}",
                                    hovertemplate=f"{name}: %{{y:.2f}} MiB/s<extra></extra>")
        fig.update_yaxes(title_text=axis("read_bytes_per_s"), row=2, col=1)
    fig.update_yaxes(title_text="data wait (ms)", row=1, col=1)
    fig.update_xaxes(title_text="step", row=2 if has_io else 1, col=1)
    share = METRIC_BY_NAME["data_share"].value(summary)
    return with_caption(fig, "Data wait and reads", f"Time each step waited for its next batch (the run: {share:.1f}% "
                        "of the step), and the bytes the process and its loader workers read: from storage, and "
                        "through read() calls including the page cache.", height=520 if has_io else 360)


def communication(run: RunData, summary: Mapping[str, Any]) -> go.Figure | None:
    """Each step's collective time per rank, how much of it was exposed, and the bandwidth it reached."""
    comm = summary.get("comm")
    steps = run.steps
    if not comm or steps.empty or not steps["comm_bytes"].fillna(0).any():
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for rank, rows in steps.sort_values("step").groupby("rank"):
        fig.add_scatter(x=rows["step"], y=rows["comm_time_s"] * 1e3, mode="lines+markers",
                        name=f"collectives, rank {int(rank)}", hovertemplate="%{y:.2f} ms<extra></extra>")
        fig.add_scatter(x=rows["step"], y=rows["comm_s"] * 1e3, mode="lines", line={"dash": "dot"},
                        name=f"exposed, rank {int(rank)}", hovertemplate="%{y:.2f} ms exposed<extra></extra>")
        bandwidth = rows["comm_bytes"] / rows["comm_time_s"].where(rows["comm_time_s"] > 0) / MIB
        fig.add_bar(x=rows["step"], y=bandwidth, name=f"bandwidth, rank {int(rank)}", opacity=0.35,
                    secondary_y=True, hovertemplate="%{y:.1f} MiB/s<extra></extra>")
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="time (ms per step)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="bandwidth (MiB/s)", secondary_y=True, rangemode="tozero")
    caption = (f"Time in the step's collectives and the part not hidden behind backward (exposed), per rank, with "
               f"the bandwidth they reached; {METRIC_BY_NAME['comm_bytes_per_step'].value(summary):.2f} MiB a step, "
               f"{METRIC_BY_NAME['comm_overlap'].value(summary):.0f}% overlapped.")
    return with_caption(fig, "Communication", caption)


def _points(fig: go.Figure, ranks: Mapping[str, Mapping[str, Any]]) -> None:
    """Each kind's ranks as points over a box, time and exposed side by side, each point named by its rank."""
    rows = [(kind, rank, k) for rank, found in ranks.items() for kind, k in found["kinds"].items()]
    custom = np.array([[k["bytes"] / MIB, k["calls"]] for _, _, k in rows], dtype=float)
    for field, label in (("time_s", "time"), ("exposed_s", "exposed")):
        hover = f"%{{text}}, %{{y}} {label}: %{{x:.2f}} ms, %{{customdata[0]:.2f}} MiB in %{{customdata[1]:.0f}} calls"
        fig.add_box(x=[1e3 * k[field] for _, _, k in rows], y=[kind for kind, _, _ in rows], name=label,
                    orientation="h", boxpoints="all", jitter=0.4, pointpos=0, text=[f"rank {r}" for _, r, _ in rows],
                    customdata=custom, hovertemplate=hover + "<extra></extra>")


def collectives(summary: Mapping[str, Any]) -> go.Figure | None:
    """Each kind of collective's time a profiled step and the part of it no computation overlapped,
    per rank (from the traces: profiler.traces.collectives): a bar each, or past MANY_RANKS a point each."""
    ranks = collectives_by_rank(summary)
    if not ranks:
        return None
    across = (summary.get("trace") or {}).get("collectives_across_ranks")
    many = len(ranks) > MANY_RANKS
    fig = figure("Communication by collective", "Each kind of collective's time a profiled step and the part of it "
                 "no computation overlapped (exposed), per rank, with its payload; from the torch.profiler traces "
                 "(on the CPU gloo's worker threads against the training thread's operators, on the GPU NCCL "
                 "kernels against compute kernels)." + (" Per rank, it shows who waits: a rank that arrives early "
                 "at a collective waits inside it, so its exposed time grows; the table of collectives across ranks "
                 "sums that waiting and names the rank the others wait for." if across else "")
                 + (f" Past {MANY_RANKS} ranks each rank is a point over the kind's box." if many else ""),
                 xaxis_title="ms per profiled step", barmode="group", boxmode="group",
                 height=max(300, 60 * len({kind for found in ranks.values() for kind in found["kinds"]}) + 140),
                 margin={"l": 130, "r": 30, "t": 50, "b": 50})
    if many:
        _points(fig, ranks)
        return fig
    for rank, found in ranks.items():
        kinds = found["kinds"]
        names = list(kinds)
        custom = np.array([[kinds[k]["bytes"] / MIB, kinds[k]["calls"]] for k in names], dtype=float)
        for field, label in (("time_s", "time"), ("exposed_s", "exposed")):
            hover = f"%{{y}} {label}: %{{x:.2f}} ms, %{{customdata[0]:.2f}} MiB in %{{customdata[1]:.0f}} calls"
            fig.add_bar(x=[1e3 * kinds[k][field] for k in names], y=names, orientation="h", customdata=custom,
                        name=f"{label}, rank {rank}", hovertemplate=hover + "<extra></extra>")
    return fig


def top_operators(run: RunData, n: int = 12) -> go.Figure | None:
    """The heaviest aten operators of the profiled steps, by self time."""
    ops = analysis.top_operators(run, n)
    if ops.empty:
        return None
    where = "device" if run.on_cuda else "CPU"
    ops = ops.iloc[::-1]
    fig = figure("Top operators", f"The {len(ops)} aten operators with the most self {where} time a profiled step "
                 "(torch.profiler window), with their share of all operator time.",
                 height=max(300, 28 * len(ops) + 110), xaxis_title=f"self {where} time (ms per profiled step)",
                 margin={"l": 230, "r": 30, "t": 50, "b": 50})
    fig.add_bar(x=ops["time_ms"], y=ops["name"], orientation="h", customdata=np.stack([ops["share"], ops["calls"]], 1),
                text=[f"{s:.0f}%" for s in ops["share"]], textposition="auto",
                hovertemplate="%{y}: %{x:.3f} ms, %{customdata[0]:.1f}% of operator time, "
                              "%{customdata[1]:.0f} calls<extra></extra>")
    return fig
