"""A directory of torch.profiler traces (one chrome JSON per rank) made into a glmperf run.

Each file is read once (profiler.traces.reader) and analysed at once, then dropped, so memory is
one trace's columns at a time however many ranks there are. A file that cannot be read is left
out and named in the run (`import.failed`); the others are imported. The run's `source` is
`import`; its steps, ops and kernels tables and its summary (with `summary.trace`) are what the
diagnosis, compare, the reports and the dashboard read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from profiler import store
from profiler.traces import collectives, comm_overlap, idle, kernel_types, launches, ranks, temporal
from profiler.traces.kernels import kernel_rows
from profiler.traces.ops import op_rows
from profiler.traces.reader import Trace, TraceError, read_trace
from profiler.traces.steps import step_rows
from profiler.traces.window import hta_window

SUFFIXES = (".json", ".json.gz")
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class ImportFailed(ValueError):
    """Nothing could be imported; the message says why, naming each file."""


@dataclass
class Imported:
    run_dir: Path
    ranks: dict[int, Path]
    failed: list[dict[str, str]] = field(default_factory=list)
    """`file` and `error` of each trace left out."""


def trace_files(trace_dir: Path) -> list[Path]:
    """The chrome traces directly in `trace_dir` (*.json, *.json.gz: tensorboard_trace_handler's
    `<worker>.<time>.pt.trace.json[.gz]` among them)."""
    if not trace_dir.is_dir():
        raise ImportFailed(f"{trace_dir} is not a directory")
    return sorted(p for p in trace_dir.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))


def rank_of(trace: Trace) -> int | None:
    """The rank the trace says (`distributedInfo.rank`), else one in its file name (`rank-3`, `rank_3`)."""
    rank = (trace.meta.get("distributedInfo") or {}).get("rank")
    if isinstance(rank, int):
        return rank
    named = RANK_IN_NAME.search(trace.path.name)
    return int(named.group(1)) if named else None


def analyze_rank(trace: Trace, rank: int) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """One rank's figures (summary.trace.ranks.<rank>) and its table rows."""
    steps = step_rows(trace, rank)
    n_steps = len(steps)
    figures: dict[str, Any] = {"file": str(trace.path), "steps": n_steps}
    window = hta_window(trace)
    if not window.gpu.empty:
        figures["window_steps"] = n_steps - 1 if n_steps >= 2 else n_steps  # HTA leaves the last step out
        figures["temporal"] = temporal.analyze(window)
        figures["kernels"] = kernel_types.analyze(window)
        figures.update(comm_overlap.analyze(window))
        figures["idle"] = idle.analyze(window)
        figures.update(launches.analyze(window))
    if comm := collectives.analyze(trace, n_steps, window):
        figures["collectives"] = comm
    tables = {"steps": steps, "ops": op_rows(trace, rank, n_steps), "kernels": kernel_rows(trace, rank, n_steps)}
    return figures, tables


def _environment(meta: dict[str, Any], gpu: bool, world_size: int) -> dict[str, Any]:
    devices = meta.get("deviceProperties") or []
    info = meta.get("distributedInfo") or {}
    return {"device": "cuda" if gpu else "cpu",
            "device_name": devices[0].get("name") if devices and isinstance(devices[0], dict) else None,
            "world_size": world_size, "job_world_size": info.get("world_size"), "backend": info.get("backend"),
            "nvml": {"available": False, "why": "imported from traces: no samples"}}


@dataclass
class Analysed:
    """Every readable trace of a set, analysed: figures and table rows by rank, and what failed."""

    per_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    tables: dict[str, list[pd.DataFrame]] = field(default_factory=lambda: {"steps": [], "ops": [], "kernels": []})
    paths: dict[int, Path] = field(default_factory=dict)
    failed: list[dict[str, str]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    """The top-level fields of the first trace read (distributedInfo, deviceProperties, ...)."""

    def table(self, name: str) -> pd.DataFrame:
        frames = self.tables[name]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def summary(self) -> dict[str, Any]:
        """summary.trace: per rank, then across ranks."""
        return {"ranks": {str(r): f for r, f in sorted(self.per_rank.items())},
                **ranks.analyze(self.table("steps"), self.per_rank)}


def analyse_traces(files: list[Path]) -> Analysed:
    """Read and analyse each file in turn (one trace in memory at a time)."""
    out = Analysed()
    unnamed = 0
    for path in files:
        try:
            trace = read_trace(path)
        except TraceError as exc:
            out.failed.append({"file": str(path), "error": str(exc)})
            continue
        rank = rank_of(trace)
        if rank is None:
            rank, unnamed = unnamed, unnamed + 1
        if rank in out.paths:
            out.failed.append({"file": str(path), "error": f"{path}: rank {rank} again (also in "
                                                             f"{out.paths[rank].name})"})
            continue
        figures, rows = analyze_rank(trace, rank)
        if not figures["steps"] and "temporal" not in figures:
            out.failed.append({"file": str(path), "error": f"{path}: no ProfilerStep#N spans and no GPU events: "
                                                             "nothing to analyse"})
            continue
        out.paths[rank], out.per_rank[rank], out.meta = path, figures, out.meta or trace.meta
        for table, df in rows.items():
            if not df.empty:
                out.tables[table].append(df)
        del trace
    return out


def trace_summary(run_dir: Path) -> dict[str, Any]:
    """summary.trace of a run profile-run measured, from its own traces (traces/rank<r>.json.gz), or {}
    when it has none: the same GPU figures an imported run gets, for profile-run on CUDA."""
    analysed = analyse_traces(store.trace_paths(run_dir))
    return analysed.summary() if analysed.per_rank else {}


def import_traces(trace_dir: str | Path, *, name: str | None = None, runs_dir: Path | None = None) -> Imported:
    """Import every trace in `trace_dir` as one run; raises ImportFailed when none can be read."""
    trace_dir = Path(trace_dir)
    files = trace_files(trace_dir)
    if not files:
        raise ImportFailed(f"no chrome traces (*.json, *.json.gz) in {trace_dir}")
    analysed = analyse_traces(files)
    if not analysed.paths:
        raise ImportFailed("no trace could be imported: " + "; ".join(f["error"] for f in analysed.failed))
    gpu = any("temporal" in f for f in analysed.per_rank.values())
    world = len(analysed.paths)
    job_world = (analysed.meta.get("distributedInfo") or {}).get("world_size")
    record = {"source": "import", "config": {}, "world_size": world,
              "environment": _environment(analysed.meta, gpu, world),
              "import": {"trace_dir": str(trace_dir.resolve()),
                         "files": {str(r): str(p) for r, p in sorted(analysed.paths.items())},
                         "failed": analysed.failed, "job_world_size": job_world},
              "pid": None}
    run_dir = store.create_run(store.default_runs_dir(runs_dir), name or trace_dir.resolve().name, record)
    for table in analysed.tables:
        store.write_table(run_dir, table, analysed.table(table))
    store.compact(run_dir)
    _finish(run_dir, analysed.summary())
    return Imported(run_dir=run_dir, ranks=analysed.paths, failed=analysed.failed)


def _finish(run_dir: Path, trace_summary: dict[str, Any]) -> None:
    """Summary and diagnosis, as `finalize` stores them for a measured run."""
    from profiler.analysis import load_run, summarize
    from profiler.recommend import advise

    ended = datetime.now(timezone.utc).isoformat(timespec="seconds")
    store.update_run(run_dir, status="completed", error=None, ended=ended, ranks=[])
    store.update_run(run_dir, summary={**summarize(load_run(run_dir)), "trace": trace_summary})
    try:  # advice is a reading of what was measured: it must never cost the import its run
        diagnosis = advise(load_run(run_dir))
    except Exception as exc:
        diagnosis = {"error": f"{type(exc).__name__}: {exc}"}
    store.update_run(run_dir, diagnosis=diagnosis)
