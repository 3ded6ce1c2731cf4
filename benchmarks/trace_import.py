"""Reading a large torch.profiler trace: `glmperf import` against HTA's TraceAnalysis and json.load.

    python -m benchmarks.trace_import [--mb 500] [--hta-mb 500] [--source PATH]

A trace of at least `--mb` MB (uncompressed JSON) is made in a temporary directory by tiling a
real one (the shared V100 2-rank all-reduce trace by default): its events are repeated, each copy
shifted in time past the previous one and given new correlation ids, and written one event per
line as Kineto writes them. Each reader then runs in a fresh process of its own, one after the
other (glmperf before and after HTA, the mean of the two), and reports its wall time, imports
included, and its peak resident memory: its own (ru_maxrss), and that of it and the processes it
started together (sampled every 50 ms), which the memory target counts:

- `glmperf import`: `profiler.traces.import_traces` into a new run (parsing, every analysis,
  the parquet tables, run.json and the diagnosis), with msgspec decoding the blocks by as many
  processes as there are CPUs (the default); in one process (`--workers 1`); and in one process
  without msgspec (orjson, the reader's path where msgspec is not installed);
- HTA: `TraceAnalysis(trace_dir=...)`, its load only (no analysis), with its default parser;
- `json.load` of the file: the floor any reader that builds the whole object tree pays.

HTA needs much more memory than the trace: when `--hta-mb` is smaller than `--mb`, HTA reads a
trace of that size instead (a smaller tile of the same source) and the ratio is taken per MB.
Targets: at least 8x faster than HTA; peak memory under twice the trace's size.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

from benchmarks.common import header, table, write_result

SOURCE = Path("/work/shared/data/traces/v100_2rank_allreduce/rank-1.json.gz")
SPEEDUP_TARGET, MEMORY_TARGET = 8.0, 2.0


def tile(source: Path, out: Path, mb: float) -> int:
    """Write a trace of at least `mb` MB made of copies of `source`'s events; returns its bytes."""
    import gzip

    with gzip.open(source, "rb") if source.suffix == ".gz" else open(source, "rb") as fh:
        trace = orjson.loads(fh.read())
    events = trace.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - start + 1000
    ids = max((e.get("args") or {}).get("correlation", 0) for e in events) + 1
    header_bytes = orjson.dumps(trace)[:-1]
    written = 0
    with open(out, "wb") as fh:
        fh.write(header_bytes + b',\n  "traceEvents": [\n')
        copy = 0
        first = True
        while written < mb * 1e6:
            for e in events:
                e = dict(e)
                if "ts" in e:
                    e["ts"] = e["ts"] + copy * span
                args = e.get("args")
                if args and "correlation" in args:
                    e["args"] = {**args, "correlation": args["correlation"] + copy * ids}
                if e.get("name", "").startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{copy * 1000 + int(e['name'][13:])}"
                line = (b"" if first else b",\n") + b"  " + orjson.dumps(e)
                first = False
                written += fh.write(line)
            copy += 1
        fh.write(b"\n  ]\n}\n")
    return out.stat().st_size


CHILD = {
    "glmperf": "from profiler.capture.import_traces import import_traces; import_traces(TRACE_DIR, runs_dir=RUNS)",
    "glmperf, one process": ("from profiler.capture.import_traces import import_traces\n"
                             "import_traces(TRACE_DIR, runs_dir=RUNS, workers=1)"),
    "glmperf, orjson only": ("from profiler.capture.import_traces import import_traces\n"
                             "from profiler.traces import blocks; blocks._DECODER = None\n"
                             "import_traces(TRACE_DIR, runs_dir=RUNS, workers=1)"),
    "hta": ("import logging; logging.disable(logging.WARNING)\n"
            "from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=str(TRACE_DIR))"),
    "json.load": "import json; json.load(open(next(TRACE_DIR.iterdir())))",
}


def measure(reader: str, trace_dir: Path, runs: Path) -> dict[str, float]:
    """Run one reader in a fresh process: its wall time (imports excluded), its peak RSS, and the peak of its RSS
    and its child processes' together (`tree`)."""
    code = (f"import resource, time, json\nfrom pathlib import Path\nTRACE_DIR, RUNS = Path({str(trace_dir)!r}), "
            f"Path({str(runs)!r})\nt = time.perf_counter()\n{CHILD[reader]}\n"
            "print(json.dumps({'s': time.perf_counter() - t, "
            "'peak': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree = _tree_peak(proc)
    out, err = proc.communicate()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, reader, out, err)
    got = json.loads(out.strip().splitlines()[-1])
    return {**got, "tree": max(tree, got["peak"])}


def _tree_peak(proc: subprocess.Popen) -> int:
    """The largest sum of the RSS of `proc` and its descendants, sampled every 50 ms until it exits (the process
    list read again each 0.5 s: sampling takes CPU from the two cores the import runs on)."""
    root, peak, family = psutil.Process(proc.pid), 0, []
    for sample in itertools.count():
        if proc.poll() is not None:
            return peak
        with contextlib.suppress(psutil.Error):
            family = [root, *root.children(recursive=True)] if sample % 10 == 0 else family
        total = 0
        for p in family:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        peak = max(peak, total)
        time.sleep(0.05)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=500.0, help="size of the large trace (MB, uncompressed)")
    parser.add_argument("--hta-mb", type=float, default=None, help="size of the trace HTA reads (default: --mb)")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the real trace to tile")
    args = parser.parse_args()
    hta_mb = args.hta_mb or args.mb
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp, "big")
        big.mkdir()
        size = tile(args.source, big / "rank-0.json", args.mb)
        sizes = {"glmperf": size, "glmperf, one process": size, "glmperf, orjson only": size, "json.load": size}
        dirs = {"glmperf": big, "glmperf, one process": big, "glmperf, orjson only": big, "json.load": big}
        if hta_mb < args.mb:
            small = Path(tmp, "small")
            small.mkdir()
            sizes["hta"], dirs["hta"] = tile(args.source, small / "rank-0.json", hta_mb), small
        else:
            sizes["hta"], dirs["hta"] = size, big
        # glmperf before and after HTA's long load, its mean taken: a shared machine's load drifts
        for reader in ("glmperf", "glmperf, one process", "hta", "glmperf", "glmperf, one process",
                       "glmperf, orjson only", "json.load"):
            t = time.perf_counter()
            got = measure(reader, dirs[reader], Path(tmp, f"runs-{time.monotonic_ns()}"))
            print(f"{reader}: {got} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
            if reader in results:
                got = {"s": (results[reader]["s"] + got["s"]) / 2, "peak": max(results[reader]["peak"], got["peak"]),
                       "tree": max(results[reader]["tree"], got["tree"])}
            results[reader] = got
    per_mb = {r: results[r]["s"] / (sizes[r] / 1e6) for r in results}
    for reader in results:
        rows.append([reader, f"{sizes[reader] / 1e6:.0f}", f"{results[reader]['s']:.1f}",
                     f"{per_mb[reader] * 1e3:.1f}", f"{results[reader]['peak'] / 2**30:.2f}",
                     f"{results[reader]['tree'] / 2**30:.2f}", f"{results[reader]['tree'] / sizes[reader]:.2f}"])
    speedup = per_mb["hta"] / per_mb["glmperf"]
    slow = per_mb["hta"] / per_mb["glmperf, orjson only"]
    memory = results["glmperf"]["tree"] / sizes["glmperf"]
    alone = per_mb["hta"] / per_mb["glmperf, one process"]
    text = header("Importing traces") + (
        f"- trace: {args.source.name} tiled to {size / 1e6:.0f} MB of JSON"
        + (f" (HTA: a {sizes['hta'] / 1e6:.0f} MB tile of the same trace)" if sizes["hta"] != size else "") + "\n\n"
        + table(["reader", "trace MB", "time (s)", "ms per MB", "peak RSS (GiB)",
                 "peak RSS with its workers (GiB)", "peak with workers / trace size"], rows)
        + f"\n\nglmperf import is {speedup:.1f}x faster than HTA's load per MB (target {SPEEDUP_TARGET:g}x: "
        f"{'met' if speedup >= SPEEDUP_TARGET else 'not met'}; in one process, --workers 1: {alone:.1f}x) on "
        f"{os.cpu_count()} CPUs; its peak memory, its workers' included, is {memory:.2f}x the trace's "
        f"size (target under {MEMORY_TARGET:g}x: {'met' if memory < MEMORY_TARGET else 'not met'}). Without msgspec "
        f"(orjson only) it is {slow:.1f}x faster than HTA.\n\n- load average at the end: "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + "\n")
    write_result("trace_import", text)


if __name__ == "__main__":
    main()
