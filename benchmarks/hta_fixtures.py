"""HTA's own figures on the shared traces, stored as the fixtures the import tests check against.

    .venv/bin/pip install HolisticTraceAnalysis   # not a dependency of glmperf
    python -m benchmarks.hta_fixtures [--traces /work/shared/data/traces]

For each trace directory, HTA's TraceAnalysis (default parser) computes per rank: the temporal
breakdown, the kernel type breakdown with memory kernels, the communication/computation overlap,
the idle time breakdown summed over streams, and the kernel launch statistics. They are written as
fractions to tests/data/traces_hta/hta_figures.json with HTA's version; the tests read that file
and do not need HTA.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from importlib.metadata import version
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces_hta" / "hta_figures.json"
TRACES = Path("/work/shared/data/traces")


def _number(x: float) -> float | None:
    """None for HTA's NaN (no communication to overlap)."""
    return None if math.isnan(x) else x


def figures(trace_dir: Path) -> dict[str, dict[str, Any]]:
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(trace_dir))
    out: dict[str, dict[str, Any]] = {}
    temporal = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    for rank in ta.t.get_ranks():
        t = temporal.loc[rank]
        span = float(t["kernel_time(us)"])
        kernels = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)[0]  # one rank a dir
        kernel_total = float(kernels["sum"].sum())
        kinds = dict(zip(kernels["kernel_type"], kernels["sum"], strict=True))
        idle = ta.get_idle_time_breakdown(ranks=[rank], visualize=False)[0]
        idle_by = idle.groupby("idle_category")["idle_time"].sum()
        launches = ta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank]
        out[str(rank)] = {
            "temporal": {"idle_share": float(t["idle_time(us)"]) / span,
                         "compute_share": float(t["compute_time(us)"]) / span,
                         "non_compute_share": float(t["non_compute_time(us)"]) / span},
            "kernels": {f"{k.lower()}_share": float(kinds.get(k, 0)) / kernel_total
                        for k in ("COMPUTATION", "COMMUNICATION", "MEMORY")},
            "comm_overlap_share": _number(float(overlap.loc[rank, "comp_comm_overlap_pctg"]) / 100),
            "idle": {f"{c}_share": float(idle_by.get(c, 0.0)) / float(idle_by.sum())
                     for c in ("host_wait", "kernel_wait", "other")},
            "launch_delay_us": {"mean": float(launches["launch_delay"].mean()),
                                "p50": float(launches["launch_delay"].median())},
            "short_kernel_share": float((launches["gpu_duration"] < launches["cpu_duration"]).mean()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    dirs = sorted({p.parent for p in args.traces.rglob("*.json.gz")})
    result = {"hta_version": version("HolisticTraceAnalysis"),
              "traces": {str(d.relative_to(args.traces)): figures(d) for d in dirs}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} (HTA {result['hta_version']}, {len(dirs)} traces)")


if __name__ == "__main__":
    main()
