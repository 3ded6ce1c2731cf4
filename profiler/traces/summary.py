"""A set of torch.profiler traces (one chrome JSON per rank) read and analyzed into summary.trace and table rows.

Each file is read once (profiler.traces.reader) and analyzed at once, then dropped, so memory is
one trace's columns at a time per worker however many ranks there are; several workers (processes, or
a Dask cluster: profiler.traces.parallel) read several files at once, and their parts are merged in
file order, as one process reading them in turn would. A file that cannot be read is named in
`failed`; the others are analyzed. `glmperf import` (profiler.capture.import_traces) makes a run of
the result, and a run profile-run measured gets its GPU figures from its own traces the same way.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profiler import store
from profiler.traces import (
    collective_skew,
    collectives,
    comm_overlap,
    idle,
    kernel_types,
    launches,
    parallel,
    ranks,
    sessions,
    temporal,
)
from profiler.traces.kernels import kernel_rows
from profiler.traces.ops import op_rows
from profiler.traces.reader import Trace, TraceError, read_trace
from profiler.traces.steps import step_rows
from profiler.traces.window import EXACT, Timing, hta_window

SUFFIXES = (".json", ".json.gz")


RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class ImportFailed(ValueError):
    """Nothing could be imported; the message says why, naming each file."""


def trace_files(trace_dir: Path) -> list[Path]:
    """The chrome traces directly in `trace_dir` (*.json, *.json.gz: tensorboard_trace_handler's
    `<worker>.<time>.pt.trace.json[.gz]` among them), or `trace_dir` itself when it is one trace file."""
    if trace_dir.is_file() and trace_dir.name.endswith(SUFFIXES):
        return [trace_dir]
    if not trace_dir.is_dir():
        what = "does not exist" if not trace_dir.exists() else "is not a chrome trace (*.json, *.json.gz)"
        raise ImportFailed(f"{trace_dir} {what}: give a trace file or a directory of them, one per rank")
    return sorted(p for p in trace_dir.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))


def rank_of(trace: Trace) -> int | None:
    """The rank the trace says (`distributedInfo.rank`), else one in its file name (`rank-3`, `rank_3`)."""
    rank = (trace.meta.get("distributedInfo") or {}).get("rank")
    if isinstance(rank, int):
        return rank
    named = RANK_IN_NAME.search(trace.path.name)
    return int(named.group(1)) if named else None


def analyze_rank(trace: Trace, rank: int, timing: Timing = EXACT
                 ) -> tuple[dict[str, Any], dict[str, pd.DataFrame], pd.DataFrame]:
    """One rank's figures (summary.trace.ranks.<rank>), its GPU times read as `timing` says (profiler.traces.window),
    its table rows, and its collective calls to match with the other ranks' (profiler.traces.collective_skew)."""
    steps = step_rows(trace, rank)
    n_steps = len(steps)
    figures: dict[str, Any] = {"file": str(trace.path), "steps": n_steps}
    window = hta_window(trace, timing)
    if not window.gpu.empty:
        figures["window_steps"] = n_steps - 1 if n_steps >= 2 else n_steps  # HTA leaves the last step out
        figures["temporal"] = temporal.analyze(window)
        figures["kernels"] = kernel_types.analyze(window)
        figures.update(comm_overlap.analyze(window))
        figures["idle"] = idle.analyze(window)
        figures.update(launches.analyze(window))
    comm, calls = collectives.analyze_calls(trace, n_steps, window)
    del window  # its copies of the GPU's events: freed before the operator tables take their own
    if comm:
        figures["collectives"] = comm
    tables = {"steps": steps, "ops": op_rows(trace, rank, n_steps), "kernels": kernel_rows(trace, rank, n_steps)}
    return figures, tables, collective_skew.rank_calls(calls, steps, trace.base_us)


@dataclass
class Analyzed:
    """Every readable trace of a set, analyzed: figures and table rows by rank, and what failed."""

    timing: Timing = EXACT
    """How the GPU figures read event times (profiler.traces.window): `exact`, or `hta` to compare with HTA."""
    per_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    tables: dict[str, list[pd.DataFrame]] = field(default_factory=lambda: {"steps": [], "ops": [], "kernels": []})
    paths: dict[int, Path] = field(default_factory=dict)
    failed: list[dict[str, str]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    """The top-level fields of the first trace read (distributedInfo, deviceProperties, ...)."""
    read: dict[str, Any] = field(default_factory=dict)
    """How the files were read: `workers` and `scheduler` (profiler.traces.parallel.Pool.how)."""
    calls: dict[int, pd.DataFrame] = field(default_factory=dict)
    """Each rank's collective calls (profiler.traces.collective_skew.rank_calls)."""

    def table(self, name: str) -> pd.DataFrame:
        frames = self.tables[name]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def summary(self) -> dict[str, Any]:
        """summary.trace: per rank, then across ranks, and the `timing` the GPU figures used."""
        steps = self.table("steps")
        step_s = float(steps.groupby("rank")["step_s"].median().median()) if not steps.empty else float("nan")
        devices = self.meta.get("deviceProperties")
        device = devices[0].get("name") if isinstance(devices, list) and devices and isinstance(devices[0], dict) \
            else None
        across = collective_skew.analyze(self.calls, step_s, device if isinstance(device, str) else None)
        return {"timing": self.timing, "ranks": {str(r): f for r, f in sorted(self.per_rank.items())},
                **ranks.analyze(steps, self.per_rank), **({"collectives_across_ranks": across} if across else {})}


@dataclass
class Part:
    """One file read and analyzed on its own (in a worker process, perhaps): the rank it says (None: it says
    none, and its tables' `rank` is -1 until the merge names it), its figures, tables and top-level fields,
    or why it could not be read."""

    path: Path
    rank: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    calls: pd.DataFrame = field(default_factory=pd.DataFrame)
    readers: int = 1
    """The processes that parsed its blocks (Trace.readers)."""

    def as_rank(self, rank: int) -> dict[str, pd.DataFrame]:
        """The tables with their rows' `rank` the one the merge gave the file."""
        return {name: df if df.empty or rank == self.rank else df.assign(rank=rank) for name, df in self.tables.items()}


def read_part(path: Path, timing: Timing = EXACT, workers: int = 1) -> Part:
    """Read and analyze one file, holding its trace only here: what each worker does for each file; `workers`:
    processes parsing its blocks (read_trace)."""
    try:
        trace = read_trace(path, workers)
    except TraceError as exc:
        return Part(path, error=str(exc))
    rank = rank_of(trace)
    figures, tables, calls = analyze_rank(trace, -1 if rank is None else rank, timing)
    return Part(path, rank, figures, tables, trace.meta, calls=calls, readers=trace.readers)


def analyze_traces(files: list[Path], timing: Timing = EXACT, *, workers: int = 1, scheduler: str | None = None,
                   progress: Callable[[str], None] | None = None) -> Analyzed:
    """Read and analyze each file (one trace in memory at a time per worker), then merge them in file order;
    `timing`: how the GPU figures read event times (`hta` only to compare with HTA's own figures). The files
    are read in this process for one worker and no scheduler, else as profiler.traces.parallel says; of
    several, each one done is told to `progress`. One file alone has its blocks parsed by `workers` processes
    (where it is large). A worker's profiling sessions make one rank (profiler.traces.sessions)."""
    if len(files) == 1 and not scheduler:
        part = read_part(files[0], timing, workers)
        return _merged([part], timing, {"workers": part.readers, "scheduler": "processes"})
    parts: list[Part | None] = [None] * len(files)
    with parallel.pool(min(workers, max(1, len(files))), scheduler) as where:
        for done, (i, part) in enumerate(where.completed(functools.partial(read_part, timing=timing), files), 1):
            if isinstance(part, parallel.WorkerDied):
                part = Part(files[i], error=f"{files[i]}: {part.why}: out of memory? read the files left out again "
                                            "with fewer --workers")
            parts[i] = part
            if progress and len(files) > 1:
                what = f"left out {part.path.name}" if part.error else \
                    f"read {part.path.name if part.rank is None else f'rank {part.rank}'}"
                progress(f"{what} ({done} of {len(files)})")
    return _merged([p for p in parts if p is not None], timing, where.how)


def _merged(parts: list[Part], timing: Timing, how: dict[str, Any]) -> Analyzed:
    """The files' parts as one set, in file order: each file's rank named (its own, another session's of its
    worker, else the next unnamed number), a rank seen again and a file with nothing to analyze left out."""
    out = Analyzed(timing=timing, read=how)
    unnamed = 0
    read: dict[int, list[sessions.Session]] = {}
    calls: dict[int, list[pd.DataFrame]] = {}
    for part in parts:
        path = part.path
        if part.error is not None:
            out.failed.append({"file": str(path), "error": part.error})
            continue
        earlier = sessions.worker_rank(path, out.paths)
        rank = part.rank if earlier is None else earlier
        if rank is None:
            rank, unnamed = unnamed, unnamed + 1
        if rank in out.paths and earlier is None:
            out.failed.append({"file": str(path), "error": f"{path}: rank {rank} again (also in "
                                                             f"{out.paths[rank].name})"})
            continue
        if not part.figures["steps"] and "temporal" not in part.figures:
            out.failed.append({"file": str(path), "error": f"{path}: no ProfilerStep#N spans and no GPU events: "
                                                             "nothing to analyze"})
            continue
        out.paths.setdefault(rank, path)
        out.meta = out.meta or part.meta
        read.setdefault(rank, []).append((path, part.figures, part.as_rank(rank)))
        calls.setdefault(rank, []).append(part.calls)
    for rank, rank_parts in read.items():
        out.per_rank[rank], rows = sessions.combine(rank_parts)
        out.calls[rank] = pd.concat(calls[rank], ignore_index=True).drop_duplicates(["step", "group", "kind", "seq"])
        for table, df in rows.items():
            if not df.empty:
                out.tables[table].append(df)
    return out


def trace_summary(run_dir: Path) -> dict[str, Any]:
    """summary.trace of a run profile-run measured, from its own traces (traces/rank<r>.json.gz), or {}
    when it has none: the same GPU figures an imported run gets, for profile-run on CUDA."""
    analyzed = analyze_traces(store.trace_paths(run_dir))
    return analyzed.summary() if analyzed.per_rank else {}
