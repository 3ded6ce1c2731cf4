"""Collectives matched across ranks: who arrives late, how long the others wait, at what bus bandwidth.

A call is one NCCL kernel (profiler.traces.collectives.analyze_calls). The ranks' calls of a process group
and kind are matched by the ProfilerStep their launch falls in and their order among that step's calls of
the group and kind (the k-th all-reduce of the tensor-parallel group in step 12 on each rank); a call some
rank lacks (a step one trace cut short) is left out. The group is the one the kernel's args name
(profiler.traces.comm_args: `groups_from` "process_group"); a trace whose kernels name none has its
calls in one group of the ranks imported (`groups_from` "ranks"), where two groups' calls of a kind
interleave.

Clocks: each trace times its events on its own host's clock, and ranks on different hosts differ by their
clocks' offset (milliseconds under NTP), which HTA and TraceLens leave in their skew. Here the offset is
measured from the collectives themselves: in an all-reduce, all-gather or reduce-scatter every rank needs
every other's data to its end, so the ranks' kernels of one call end together (on one host within a few
microseconds) however late each arrived. A rank's offset is the median, over such calls, of its kernel's end
minus the call's median end; where the offsets spread wider than CLOCK_TOLERANCE_US, each rank's starts are
moved by its offset before skew is read (`clocks.aligned`). A rank that is late rather than ahead keeps its
lateness: the others wait for it inside their kernels, and the ends still meet.

Per call: `skew`, the last start minus the first; the rank that arrived last (none when several share
the last start); the moving time, the last arriver's kernel duration (it waited least: in a collective
all ranks finish together); each other rank's duration beyond it is waiting. Per kind: the calls matched,
the skew's median and p90, the rank most often last, kernel time and the share of it spent waiting, and
bus bandwidth: bytes / moving time (algorithm bandwidth) times NCCL's factor for the kind and the n
ranks of the group (its `Group size`; without it the ranks matched) (nccl-tests doc/PERFORMANCE.md:
all_reduce 2(n-1)/n; all_gather, reduce_scatter and all_to_all (n-1)/n; broadcast and send/recv 1),
which that document says to compare with the hardware's peak whatever n is.

A straggler is named when one rank is last in more than LAST_SHARE of at least MIN_CALLS calls of a group's
kind and the kind's median skew exceeds SKEW_OF_STEP of the median step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from profiler.traces import comm_args

BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}
"""Bus bandwidth over algorithm bandwidth by kind (nccl-tests doc/PERFORMANCE.md, 'Bus bandwidth')."""
LINK_PEAK = (
    (re.compile(r"H200"), 450.0, "NVLink 4: 900 GB/s per GPU both ways (NVIDIA H200 datasheet), 450 each way"),
    (re.compile(r"H100.*PCIe"), 63.0, "PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b, each way (PCI-SIG)"),
    (re.compile(r"H100"), 450.0, "NVLink 4: 900 GB/s per GPU both ways (NVIDIA H100 SXM datasheet), 450 each way"),
    (re.compile(r"A100.*PCIe"), 31.5, "PCIe Gen4 x16: 16 GT/s x 16 lanes, 128b/130b, each way (PCI-SIG)"),
    (re.compile(r"A100"), 300.0, "NVLink 3: 600 GB/s per GPU both ways (NVIDIA A100 SXM datasheet), 300 each way"),
    (re.compile(r"V100.*PCIe"), 15.75, "PCIe Gen3 x16: 8 GT/s x 16 lanes, 128b/130b, each way (PCI-SIG)"),
    (re.compile(r"V100"), 150.0, "NVLink 2: 300 GB/s per GPU both ways (NVIDIA V100 SXM2 datasheet), 150 each way"),
)
"""Peak bus bandwidth (GB/s, one direction, what busbw measures) of the GPU's link within a host, by device
name. Across hosts the network bounds it lower."""
MIN_CALLS = 10
"""Fewer calls than this say nothing about who is usually last."""
LAST_SHARE = 0.5
"""More than half the calls: one rank is last more often than all the others together."""
SKEW_OF_STEP = 0.05
"""A rank that arrives this late makes every rank wait about that long each step (it is late at each
collective, not once per call: the lateness carries over), the same 5% profiler.traces.ranks counts a
slow step by; below it the spread is noise of launch order and clocks."""


SYNCHRONOUS = ("all_reduce", "all_gather", "reduce_scatter")
"""Kinds whose ranks all finish together: their kernels' ends give the clocks' offsets (module docstring)."""
CLOCK_TOLERANCE_US = 100.0
"""Offsets spread wider than this are clocks, not noise: ranks on one host end a call within a few us, the
clocks of hosts under NTP differ by milliseconds."""

GROUP = ["group", "group_desc", "group_ranks", "group_size"]
"""A call's process group, as profiler.traces.collectives.CALLS has it ("" and -1 where its args name none)."""


def rank_calls(calls: pd.DataFrame, steps: pd.DataFrame, base_us: int) -> pd.DataFrame:
    """One rank's calls keyed for matching: `kind`, `step` (the ProfilerStep its launch falls in, -1 before
    the first or without steps), `seq` (its order among the step's calls of its group and kind), `start_us`
    on the trace's clock, `dur_us`, `bytes` and the GROUP columns."""
    if calls.empty:
        return pd.DataFrame(columns=["kind", "step", "seq", "start_us", "dur_us", "bytes", *GROUP])
    step = np.full(len(calls), -1, dtype=np.int64)
    if not steps.empty:
        spans = steps.sort_values("ts_end")
        starts = ((spans["ts_end"] - spans["step_s"]) * 1e6).to_numpy()
        at = np.searchsorted(starts, calls["launch_us"].to_numpy(dtype=float) + base_us, side="right") - 1
        step = np.where(at >= 0, spans["step"].to_numpy()[np.maximum(at, 0)], -1)
    out = pd.DataFrame({"kind": calls["kind"].to_numpy(), "step": step,
                        "start_us": calls["start_us"].to_numpy(dtype=float) + base_us,
                        "dur_us": calls["dur_us"].to_numpy(dtype=float), "bytes": calls["bytes"].to_numpy(dtype=float),
                        **{c: calls[c].to_numpy() for c in GROUP}})
    out = out.sort_values("start_us", kind="stable", ignore_index=True)
    return out.assign(seq=out.groupby(["step", "group", "kind"]).cumcount())


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _link(device: str | None) -> tuple[float, str] | None:
    return next(((peak, source) for pattern, peak, source in LINK_PEAK if device and pattern.search(device)), None)


def _of(calls: pd.DataFrame, group: str, kind: str) -> pd.DataFrame:
    return calls[(calls["kind"] == kind).to_numpy() & (calls["group"] == group).to_numpy()]


def _pivot(calls: Mapping[int, pd.DataFrame], kind: str, group: str) -> tuple[pd.DataFrame, int] | None:
    """The calls of `group` and `kind` that every rank with any of them has, a row each and a column per rank
    under `start_us`, `dur_us` and `bytes`; and the largest `Group size` their args give (0: none). None
    under two ranks with such calls."""
    own = [mine.assign(rank=r) for r, c in sorted(calls.items()) if len(mine := _of(c, group, kind))]
    if len(own) < 2:
        return None
    long = pd.concat(own)
    sizes = long["group_size"].to_numpy(dtype=np.int64)
    wide = long.set_index(["step", "seq", "rank"])[["start_us", "dur_us", "bytes"]].unstack("rank")
    return wide[wide["start_us"].notna().all(axis=1)], int(sizes.max()) if (sizes > 0).any() else 0


def matched(calls: Mapping[int, pd.DataFrame], kind: str, group: str = "") -> pd.DataFrame:
    """The calls of `group` and `kind` matched across the ranks that have any (each rank's `rank_calls`), one
    row each: `step`, `seq`, `ranks` (matched), `group_size` (the n of the bus factor), `skew_us`, `last` (the
    rank that started last, -1 when several did), `moving_us`, `waiting_us` (summed over the ranks), `time_us`
    (kernel time, summed), `bytes`, `algbw_gb_s` and `busbw_gb_s` (module docstring)."""
    pivoted = _pivot(calls, kind, group)
    if pivoted is None:
        return pd.DataFrame(columns=["step", "seq", "ranks", "group_size", "skew_us", "last", "moving_us",
                                     "waiting_us", "time_us", "bytes", "algbw_gb_s", "busbw_gb_s"])
    wide, size = pivoted
    ranks = wide["start_us"].columns.to_numpy()
    start, dur = wide["start_us"].to_numpy(), wide["dur_us"].to_numpy()
    latest = start.max(axis=1)
    is_last = start == latest[:, None]
    moving = np.where(is_last, dur, np.inf).min(axis=1)
    payload = wide["bytes"].median(axis=1).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(moving > 0, payload / moving / 1e3, np.nan)  # bytes per us / 1e3: GB/s
    n = size or len(ranks)
    return pd.DataFrame({
        "step": wide.index.get_level_values("step"), "seq": wide.index.get_level_values("seq"), "ranks": len(ranks),
        "group_size": n,
        "skew_us": latest - start.min(axis=1),
        "last": np.where(is_last.sum(axis=1) == 1, ranks[start.argmax(axis=1)], -1),
        "moving_us": moving, "waiting_us": np.clip(dur - moving[:, None], 0, None).sum(axis=1),
        "time_us": dur.sum(axis=1), "bytes": payload, "algbw_gb_s": algbw,
        "busbw_gb_s": algbw * BUS_FACTOR.get(kind, lambda _: 1.0)(n)})


def clock_offsets(calls: Mapping[int, pd.DataFrame]) -> tuple[dict[int, float], int]:
    """Each rank's clock offset in us (its kernels' ends minus the calls' median ends, median over the
    SYNCHRONOUS calls matched across all ranks of their group), and the number of calls it rests on."""
    deviations: list[pd.DataFrame] = []
    pairs = {key for c in calls.values() for key in zip(c["group"], c["kind"], strict=True) if key[1] in SYNCHRONOUS}
    for group, kind in sorted(pairs):
        pivoted = _pivot(calls, kind, group)
        if pivoted is not None:
            ends = pivoted[0]["start_us"] + pivoted[0]["dur_us"]
            deviations.append(ends.sub(ends.median(axis=1), axis=0))
    if not deviations:
        return {}, 0
    each = pd.concat(deviations)
    return {int(r): float(each[r].median()) for r in each.columns if each[r].notna().any()}, len(each)


def _aligned(calls: Mapping[int, pd.DataFrame]) -> tuple[dict[int, pd.DataFrame], dict[str, Any] | None]:
    """The calls with each rank's starts on one clock where the offsets say the clocks differ, and the
    `clocks` figures (None without calls to measure them by)."""
    offsets, used = clock_offsets(calls)
    if not offsets:
        return dict(calls), None
    aligned = max(offsets.values()) - min(offsets.values()) > CLOCK_TOLERANCE_US
    clocks = {"aligned": aligned, "offsets_us": {str(r): round(o, 3) for r, o in sorted(offsets.items())},
              "calls": used}
    if not aligned:
        return dict(calls), clocks
    return {r: c.assign(start_us=c["start_us"] - offsets.get(r, 0.0)) for r, c in calls.items()}, clocks


def ranks_text(ranks: list[int]) -> str:
    """A group's ranks as printed: all of a short list, the ends of a long one (a group of 512 ranks is one
    cell of a table)."""
    shown = ranks if len(ranks) <= 8 else [ranks[0], ranks[1], "...", ranks[-1]]
    return ", ".join(map(str, shown))


def clocks_text(clocks: Mapping[str, Any] | None) -> str | None:
    """What the clocks' offsets did to the skew, in one sentence; None where they did nothing."""
    if not clocks or not clocks.get("aligned"):
        return None
    offsets = ", ".join(f"rank {r} {o / 1e3:+.3f} ms" for r, o in clocks["offsets_us"].items())
    return (f"The ranks' clocks differ (offsets measured by {clocks['calls']} collectives' common end: {offsets}); "
            "starts were put on one clock before their skew was read.")


def _median(values: pd.Series) -> float | None:
    return _finite(float(values.median())) if values.notna().any() else None


def _kind(calls: pd.DataFrame, device: str | None) -> dict[str, Any]:
    """A kind's figures from its `matched` calls (module docstring)."""
    skew_ms = calls["skew_us"] / 1e3
    last = calls.loc[calls["last"] >= 0, "last"].value_counts()
    time_us, waiting_us = float(calls["time_us"].sum()), float(calls["waiting_us"].sum())
    bus = _median(calls["busbw_gb_s"])
    link = _link(device)
    return {
        "ranks": int(calls["ranks"].iloc[0]), "calls": len(calls),
        "skew_ms": {"p50": float(skew_ms.median()), "p90": float(skew_ms.quantile(0.9)), "max": float(skew_ms.max())},
        "last": {"rank": int(last.index[0]), "calls": int(last.iloc[0]), "of": int(last.sum())} if len(last) else None,
        "time_s": time_us / 1e6, "waiting_s": waiting_us / 1e6,
        "waiting_share": waiting_us / time_us if time_us > 0 else None,
        "algbw_gb_s": _median(calls["algbw_gb_s"]), "busbw_gb_s": bus,
        "link_peak_gb_s": link[0] if link else None, "link": link[1] if link else None,
        "busbw_of_peak": bus / link[0] if link and bus is not None else None,
    }


def _straggler(groups: list[dict[str, Any]], step_s: float) -> dict[str, Any] | None:
    """The rank last in most calls of a group's kind, with the evidence, where module docstring's rule names one."""
    named = [{"rank": k["last"]["rank"], "kind": kind, "group": g["name"],
              "last_share": k["last"]["calls"] / k["calls"], "calls": k["calls"], "skew_ms": k["skew_ms"]["p50"]}
             for g in groups for kind, k in g["kinds"].items()
             if k["last"] and k["calls"] >= MIN_CALLS and k["last"]["calls"] > LAST_SHARE * k["calls"]
             and math.isfinite(step_s) and k["skew_ms"]["p50"] / 1e3 > SKEW_OF_STEP * step_s]
    return max(named, key=lambda s: s["skew_ms"] * s["calls"], default=None)


def straggler_calls(straggler: Mapping[str, Any]) -> str:
    """The calls a straggler's evidence counts, as `show` and the diagnosis word them: "all_reduce calls
    (process group 0)"; no group where the trace names none (or an earlier run stored none)."""
    group = f" (process group {straggler['group']})" if straggler.get("group") is not None else ""
    return f"{straggler['kind']} calls{group}"


def _group(calls: Mapping[int, pd.DataFrame], group: str) -> dict[str, Any]:
    """A process group as its calls' args name it: `name`, `description`, `ranks`, `size` (the ranks with
    calls in it where the args give none; all null but those for the group of calls that name none)."""
    mine = pd.concat([c[c["group"] == group].assign(rank=r) for r, c in calls.items()])
    desc, ranks = (next((v for v in mine[c] if isinstance(v, str)), None) for c in ("group_desc", "group_ranks"))
    sizes = mine["group_size"].to_numpy(dtype=np.int64)
    listed = sorted(int(r) for r in mine["rank"].unique())
    return {"name": group or None, "description": desc, "ranks": comm_args.ranks(ranks) or listed,
            "size": int(sizes.max()) if (sizes > 0).any() else len(listed), "kinds": {}}


def analyze(calls: Mapping[int, pd.DataFrame], step_s: float, device: str | None) -> dict[str, Any]:
    """{"groups_from", "groups": [{name, description, ranks, size, "kinds": {kind: figures}}], "clocks":
    {aligned, offsets_us, calls} (module docstring), "straggler": {...} or absent}, from each rank's
    `rank_calls`; {} under two ranks with calls of a group. `groups_from`: "process_group" where the kernels'
    args name their groups, else "ranks" (module docstring). `unmatched`: the calls of the rank with the most
    that found no partner. `step_s`: the median step (NaN: unknown, no straggler named); `device`: the GPU's
    name."""
    calls, clocks = _aligned(calls)
    groups: dict[str, dict[str, Any]] = {}
    pairs = {key for c in calls.values() for key in zip(c["group"], c["kind"], strict=True)}
    for group, kind in sorted(pairs, key=lambda p: (p[0] == "", p)):  # the calls that name no group last
        rows = matched(calls, kind, group)
        if not rows.empty:
            most = max(len(_of(c, group, kind)) for c in calls.values())
            found = groups.setdefault(group, _group(calls, group))
            found["kinds"][kind] = {**_kind(rows, device), "unmatched": most - len(rows)}
    if not groups:
        return {}
    straggler = _straggler(list(groups.values()), step_s)
    return {"groups_from": "process_group" if any(groups) else "ranks", "groups": list(groups.values()),
            **({"clocks": clocks} if clocks else {}), **({"straggler": straggler} if straggler else {})}
