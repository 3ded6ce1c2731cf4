"""`glmperf import TRACE_DIR`: existing torch.profiler traces (one chrome JSON per rank) as a run.

Exit codes: 0 imported (some rank files may have failed: each is named on stderr), 2 bad input
(no directory, no trace, or none readable; --workers under 1, a --scheduler that cannot be used) with
one `glmperf: error: ...` line, before any file is read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO, Any

from profiler import store
from profiler.cli import common
from profiler.traces.collective_skew import straggler_calls


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("import", help="import existing torch.profiler traces (one chrome JSON per rank) as "
                              "a run", description="Read every chrome trace (*.json, *.json.gz) in TRACE_DIR, one "
                              "per rank (a worker's several profiling sessions make one rank), or the one trace file "
                              "TRACE_DIR names, and store them as a run that diagnose, compare, report and the "
                              "dashboard read. GPU traces get HTA's temporal, kernel, overlap and idle breakdowns.")
    p.add_argument("trace_dir", type=Path, metavar="TRACE_DIR", help="directory of the traces (e.g. the one "
                   "tensorboard_trace_handler wrote), or one trace file")
    p.add_argument("--name", help="run name (default: the directory's name, or the file's without .json[.gz])")
    p.add_argument("--workers", type=common.positive_int, metavar="N", help="processes reading the rank files at "
                   "once, one trace each at a time (default: one per CPU, at most one per file; 1: this process "
                   "alone); a single large trace has its blocks parsed by that many processes; with --scheduler "
                   "local, the Dask workers")
    p.add_argument("--scheduler", type=_scheduler, metavar="ADDRESS|local", help="read the files on a Dask "
                   "cluster: the address of its scheduler (tcp://HOST:PORT; its workers need glmperf installed), or "
                   "`local` for a LocalCluster of --workers processes here (needs Dask: pip install "
                   "'dask[distributed]>=2024.1')")
    p.add_argument("--no-progress", action="store_true", help="no line per rank file read")
    common.add_runs_dir(p)
    common.add_json(p, "print the run's id, path, summary and diagnosis as JSON")


def _scheduler(text: str) -> str:
    """--scheduler: `local`, or an address (`tcp://HOST:PORT`, `HOST:PORT`); whether one answers there is
    checked when the import starts."""
    from profiler.traces.parallel import LOCAL

    if text != LOCAL and "://" not in text and not text.rpartition(":")[2].isdigit():
        raise argparse.ArgumentTypeError(f"got {text}; allowed: {LOCAL}, or a Dask scheduler's address "
                                         "(tcp://HOST:PORT)")
    return text


def main(args: argparse.Namespace) -> int:
    from profiler.analysis import load_run
    from profiler.capture.import_traces import import_traces
    from profiler.cli import console
    from profiler.traces import ImportFailed
    from profiler.traces.parallel import LOCAL, SchedulerError

    store.check_runs_dir(common.runs_dir(args))
    with common.bad_input_from(ImportFailed, SchedulerError):
        imported = import_traces(args.trace_dir, name=args.name, runs_dir=args.runs_dir, workers=args.workers,
                                 scheduler=args.scheduler, progress=None if args.no_progress else common.status_line)
    for failure in imported.failed:
        print(f"glmperf: warning: left out {failure['error']}", file=sys.stderr)
    run = load_run(imported.run_dir)
    summary, diagnosis = run.stored_summary or {}, run.diagnosis
    if args.json:
        common.print_json({"id": run.id, "path": str(run.path), "source": run.source, "failed": imported.failed,
                           "summary": summary, "diagnosis": diagnosis})
        return common.EXIT_OK
    workers, scheduler = imported.read["workers"], imported.read["scheduler"]
    where = {"processes": "one process" if workers == 1 else f"{workers} worker processes",
             LOCAL: f"a Dask LocalCluster of {workers} worker processes"}.get(
        scheduler, f"{workers} workers of the Dask scheduler at {scheduler}")
    print(f"imported {len(imported.ranks)} rank(s) from {args.trace_dir} as run {run.id} (read by {where})")
    for rank, files in imported.sessions.items():
        print(f"rank {rank}: {len(files)} profiling sessions of one worker, read as one rank "
              f"({', '.join(Path(f).name for f in files)})")
    console.print_summary(run.record, summary, run.status, run.path, sys.stdout)
    print_trace(summary.get("trace") or {}, sys.stdout)
    console.print_advice_head(run.id, diagnosis, sys.stdout)
    return common.EXIT_OK


def print_trace(trace: dict[str, Any], out: IO[str]) -> None:
    """Per rank, HTA's GPU breakdowns (% of GPU time, of kernel time, of idle time); then stragglers."""
    rows = [(rank, f) for rank, f in trace.get("ranks", {}).items() if f.get("temporal")]
    if rows:
        out.write("\nGPU (HTA's definitions)  idle  compute  other | kernels: comp  comm  mem | comm overlapped | "
                  "idle: host wait  kernel wait | launch delay p50 | short kernels\n")
    for rank, f in rows:
        t, k, i = f["temporal"], f.get("kernels") or {}, f.get("idle") or {}
        overlap = f.get("comm_overlap_share")
        out.write(f"  rank {rank:<18} {100 * t['idle_share']:4.0f}%  {100 * t['compute_share']:6.0f}%  "
                  f"{100 * t['non_compute_share']:4.0f}% | {100 * k.get('computation_share', 0):12.0f}%  "
                  f"{100 * k.get('communication_share', 0):3.0f}%  {100 * k.get('memory_share', 0):2.0f}% | "
                  f"{'-' if overlap is None else f'{100 * overlap:.0f}%':>15} | "
                  f"{100 * i.get('host_wait_share', 0):14.0f}%  {100 * i.get('kernel_wait_share', 0):10.0f}% | "
                  f"{(f.get('launch_delay_us') or {}).get('p50', float('nan')):13.0f} us | "
                  f"{100 * f.get('short_kernel_share', float('nan')):.0f}%\n")
    for s in trace.get("stragglers", []):
        out.write(f"straggler: rank {s['rank']}'s median step is {s['over_median']:.2f}x the median rank's\n")
    wait = trace.get("comm_wait")
    if wait:
        out.write(f"communication wait imbalance across ranks: {100 * wait['imbalance']:.0f}%\n")
    print_collectives(trace, out)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _group_name(group: dict[str, Any]) -> str:
    """A process group as its args name it: `process group 0 (default_pg): 2 ranks [0, 1]`, a long list cut."""
    if group["name"] is None:
        return "calls that name no process group"
    desc = f" ({group['description']})" if group["description"] else ""
    from profiler.traces.collective_skew import ranks_text  # numpy and pandas: only when there is a table

    return f"process group {group['name']}{desc}: {group['size']} ranks [{ranks_text(group['ranks'])}]"


def print_collectives(trace: dict[str, Any], out: IO[str]) -> None:
    """Collectives matched across ranks (summary.trace.collectives_across_ranks): per process group and kind
    the calls matched, the start skew, the rank most often last, the share of kernel time spent waiting, the
    median bus bandwidth against the link's peak; then the straggler it names, if any."""
    across = trace.get("collectives_across_ranks") or {}
    # a run imported before process groups were told apart holds one group's `kinds`
    groups = across.get("groups") or ([{"name": None, "kinds": across["kinds"]}] if across.get("kinds") else [])
    if not groups:
        return
    out.write("\ncollectives across ranks   calls x ranks | skew p50    p90 | last most often | waiting | "
              "bus bandwidth p50\n")
    by_args = across.get("groups_from") == "process_group"
    if not by_args:
        out.write("  (the kernels name no process group: the ranks imported are taken as one)\n")
    for group in groups:
        if by_args:
            out.write(f"  {_group_name(group)}\n")
        for kind, k in group["kinds"].items():
            last = k["last"]
            late = f"rank {last['rank']} {100 * last['calls'] / k['calls']:.0f}%" if last else "-"
            bus = "no payload bytes" if k["busbw_gb_s"] is None else f"{k['busbw_gb_s']:.1f} GB/s (" + (
                "link peak unknown" if k["link_peak_gb_s"] is None else
                f"{_pct(k['busbw_of_peak'])} of {k['link_peak_gb_s']:g} GB/s") + ")"
            named = f"  {kind}" if by_args else kind  # under its group's line
            out.write(f"  {named:<24} {k['calls']:>7} x {k['ranks']:<3} | {k['skew_ms']['p50']:5.2f} "
                      f"{k['skew_ms']['p90']:6.2f} ms | {late:>15} | {_pct(k['waiting_share']):>7} | {bus}\n")
    from profiler.traces.collective_skew import clocks_text  # numpy and pandas: only when there is a table

    clocks = clocks_text(across.get("clocks"))
    if clocks:
        out.write(f"clocks: {clocks}\n")
    s = across.get("straggler")
    if s:
        out.write(f"straggler: rank {s['rank']} arrived last in {100 * s['last_share']:.0f}% of {s['calls']} "
                  f"{straggler_calls(s)}, median {s['skew_ms']:.1f} ms after the first\n")
