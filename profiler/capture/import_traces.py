"""A directory of torch.profiler traces (one chrome JSON per rank), or one trace file, made into a glmperf run:
`glmperf import`.

The traces are read and analyzed by profiler.traces.summary, one at a time per worker: in this
process, in several processes of this machine, or on a Dask cluster (profiler.traces.parallel), as
`import.workers` and `import.scheduler` say. A file that cannot be read is left out and named in the
run (`import.failed`); the others are imported. A worker's several profiling sessions
(tensorboard_trace_handler's files) are one rank (`import.sessions`). The run's `source` is `import`;
its steps, ops and kernels tables and its summary (with `summary.trace`) are what the diagnosis,
compare, the reports and the dashboard read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler import store
from profiler.capture.finish import finalize
from profiler.traces import parallel
from profiler.traces.summary import ImportFailed, analyze_traces, trace_files


@dataclass
class Imported:
    run_dir: Path
    ranks: dict[int, Path]
    failed: list[dict[str, str]] = field(default_factory=list)
    """`file` and `error` of each trace left out."""
    sessions: dict[int, list[str]] = field(default_factory=dict)
    """The files of each rank read from several profiling sessions of one worker, in time order."""
    read: dict[str, Any] = field(default_factory=dict)
    """How the files were read: `workers`, `scheduler` (the record's `import.workers`, `import.scheduler`)."""


def _environment(meta: dict[str, Any], gpu: bool, world_size: int) -> dict[str, Any]:
    devices = meta.get("deviceProperties") or []
    info = meta.get("distributedInfo") or {}
    return {"device": "cuda" if gpu else "cpu",
            "device_name": devices[0].get("name") if devices and isinstance(devices[0], dict) else None,
            "world_size": world_size, "job_world_size": info.get("world_size"), "backend": info.get("backend"),
            "nvml": {"available": False, "why": "imported from traces: no samples"}}


def import_traces(trace_dir: str | Path, *, name: str | None = None, runs_dir: Path | None = None,
                  workers: int | None = None, scheduler: str | None = None,
                  progress: Callable[[str], None] | None = None) -> Imported:
    """Import every trace in `trace_dir` (or the one trace file it names) as one run, read by `workers`
    processes (default: one per CPU, at most one per file; one large file alone has its blocks parsed by them
    all) or on the Dask `scheduler` (`local` or an address), each file done told to `progress`; raises
    ImportFailed when none can be read, SchedulerError when the scheduler cannot be used."""
    trace_dir = Path(trace_dir)
    files = trace_files(trace_dir)
    if not files:
        raise ImportFailed(f"no chrome traces (*.json, *.json.gz) in {trace_dir}")
    workers = workers or parallel.default_workers(os.cpu_count())
    analyzed = analyze_traces(files, workers=workers, scheduler=scheduler, progress=progress)
    if not analyzed.paths:
        raise ImportFailed("no trace could be imported: " + "; ".join(f["error"] for f in analyzed.failed))
    gpu = any("temporal" in f for f in analyzed.per_rank.values())
    world = len(analyzed.paths)
    job_world = (analyzed.meta.get("distributedInfo") or {}).get("world_size")
    sessions = {r: f["sessions"] for r, f in sorted(analyzed.per_rank.items()) if "sessions" in f}
    record = {"source": "import", "config": {}, "world_size": world,
              "environment": _environment(analyzed.meta, gpu, world),
              "import": {"trace_dir": str(trace_dir.resolve()),
                         "files": {str(r): str(p) for r, p in sorted(analyzed.paths.items())},
                         "sessions": {str(r): files for r, files in sessions.items()},
                         "failed": analyzed.failed, "job_world_size": job_world, **analyzed.read},
              "pid": None}
    default = trace_dir.resolve().name.removesuffix(".gz").removesuffix(".json") if trace_dir.is_file() else \
        trace_dir.resolve().name
    run_dir = store.create_run(store.default_runs_dir(runs_dir), name or default, record)
    for table in analyzed.tables:
        store.write_table(run_dir, table, analyzed.table(table))
    finalize(run_dir, trace=analyzed.summary())
    return Imported(run_dir=run_dir, ranks=analyzed.paths, failed=analyzed.failed, sessions=sessions,
                    read=analyzed.read)

