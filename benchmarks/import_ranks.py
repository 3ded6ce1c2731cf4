"""Importing a job of many ranks: one process against several worker processes against a Dask LocalCluster.

    python -m benchmarks.import_ranks [--ranks 32] [--workers 2] [--rounds 2] [--source PATH]

A job of `--ranks` ranks is made in a temporary directory by tiling a real trace (the shared A100
2-rank NCCL trace by default): one copy per rank, each with its `distributedInfo.rank` changed
(`tile_ranks`, which tests/test_import_parallel.py uses too). Each way of reading it then imports it
in a fresh process of its own (`profiler.capture.import_traces`: every analysis, the parquet tables,
run.json and the diagnosis), the ways in turn, `--rounds` times: one process (`--workers 1`),
`--workers N` processes, and a Dask LocalCluster of N processes (`--scheduler local`). Each reports
its wall time (imports and the cluster's start included) and peak resident memory: the importing
process's (ru_maxrss) and its largest worker process's (VmHWM, polled every 50 ms).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from benchmarks.common import header, table, write_result

SOURCE = Path("/work/shared/data/traces/a100_2rank_nccl/rank-0.json.gz")


def tile_ranks(source: Path, out: Path, ranks: int, steps: int | None = None) -> list[Path]:
    """`ranks` gzip copies of `source` in `out` (rank-<r>.json.gz), each saying its rank and the job's world
    size in `distributedInfo`; with `steps`, smaller: only its complete events (the only ones read) that start
    before its `steps`+1-th ProfilerStep."""
    with gzip.open(source, "rb") as fh:
        trace = orjson.loads(fh.read())
    if steps is not None:
        starts = sorted(e["ts"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
        end = starts[steps] if len(starts) > steps else float("inf")
        trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("ts", end) < end]
    info = trace.get("distributedInfo") or {}
    files = []
    for rank in range(ranks):
        trace["distributedInfo"] = {**info, "rank": rank, "world_size": ranks}
        path = out / f"rank-{rank}.json.gz"
        path.write_bytes(gzip.compress(orjson.dumps(trace), compresslevel=1))
        files.append(path)
    return files


WAYS = {"one process (--workers 1)": {"workers": 1}, "processes (--workers N)": {},
        "Dask LocalCluster (--scheduler local --workers N)": {"scheduler": "local"}}


WATCH = """
import os, threading, psutil
PEAKS = {}
def watch():
    # every 50 ms, each descendant's peak RSS so far (VmHWM): its workers are the forkserver's children,
    # or the Dask nannies', so ru_maxrss of this process's children would not see them
    me = psutil.Process()
    while True:
        for child in me.children(recursive=True):
            try:
                with open(f"/proc/{child.pid}/status") as fh:
                    hwm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
            except (OSError, StopIteration):
                continue
            PEAKS[child.pid] = max(PEAKS.get(child.pid, 0), hwm)
        time.sleep(0.05)
threading.Thread(target=watch, daemon=True).start()
"""


def measure(trace_dir: Path, runs: Path, options: dict[str, Any]) -> dict[str, float]:
    """Import `trace_dir` in a fresh process with `options`: wall time, and peak RSS of it and of its largest
    descendant process (a worker)."""
    code = ("import resource, time, json\nfrom pathlib import Path\nt = time.perf_counter()\n" + WATCH
            + "from profiler.capture.import_traces import import_traces\n"
            f"import_traces(Path({str(trace_dir)!r}), runs_dir=Path({str(runs)!r}), **{options!r})\n"
            "print(json.dumps({'s': time.perf_counter() - t, "
            "'parent': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "
            "'worker': max(PEAKS.values(), default=0)}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=32, help="ranks of the tiled job")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the parallel ways")
    parser.add_argument("--rounds", type=int, default=2, help="imports of each way, in turn (the median is shown)")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the real trace to tile")
    args = parser.parse_args()
    got: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp, "traces")
        traces.mkdir()
        files = tile_ranks(args.source, traces, args.ranks)
        size = sum(f.stat().st_size for f in files)
        for round_ in range(args.rounds):
            for way, options in WAYS.items():
                options = {"workers": args.workers, **options}
                got[way].append(measure(traces, Path(tmp, f"runs-{round_}"), options))
                print(f"{way}: {got[way][-1]}", file=sys.stderr)
    serial = statistics.median(r["s"] for r in got["one process (--workers 1)"])
    rows = []
    for way, runs in got.items():
        s = statistics.median(r["s"] for r in runs)
        worker = "(itself)" if way.startswith("one process") else f"{max(r['worker'] for r in runs) / 2**20:.0f}"
        rows.append([way.replace("N", str(args.workers)), f"{s:.1f}", f"{serial / s:.2f}x",
                     f"{max(r['parent'] for r in runs) / 2**20:.0f}", worker])
    text = header("Importing many ranks in parallel") + (
        f"- job: {args.source.name} tiled to {args.ranks} ranks ({size / 1e6:.1f} MB of gzip), {args.rounds} "
        f"imports of each way in turn, the median shown\n\n"
        + table(["way", "time (s)", "speed-up", "peak RSS, importing process (MiB)",
                 "peak RSS, largest worker (MiB)"], rows)
        + "\n- load average at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + "\n")
    write_result("import_ranks", text)


if __name__ == "__main__":
    main()
