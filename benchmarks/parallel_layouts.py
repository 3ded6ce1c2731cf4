"""Parallel layouts on this CPU (torchrun over gloo) next to DDP, and `glmperf plan` for 8 GPUs.

    python -m benchmarks.parallel_layouts [--quick] [--steps N]

Measured, per layout of tiny and small on 2 and 4 ranks (`profile-run --nproc N`): tokens/s of the
steps outside the profiler's window (each token once: ranks sharing a batch count their share), the
bytes of parameters, gradients and optimizer state a rank holds (run.json `ranks[].held_bytes`, the
largest rank), the process's peak RSS, the collectives' payload bytes per step and the exposed share
of the step as the traces show them (summary.trace.ranks.*.collectives, the largest rank; for a
pipeline the exposed send/recv as a share of its schedule, next to the bubble (p-1)/(v*m+p-1)), and
`glmperf plan`'s figures for the same config beside them. Planned, for glm-1.5b
and glm4-9b on 8 H200s per layout: the per-rank bytes, whether they fit, communication per step and
the pipeline bubble. Writes benchmarks/results/parallel_layouts.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, fmt, header, table, write_result
from profiler import store
from profiler.advice.gpus import GPUS_GB
from profiler.advice.plan import plan
from profiler.analysis.comm import collectives_by_rank
from profiler.capture.run import profile_run
from profiler.config import load_config

MEASURED = [  # (preset, nproc, label, overrides)
    ("tiny", 2, "DDP", []),
    ("tiny", 2, "fsdp=2", ["switches.parallel.fsdp=2"]),
    ("tiny", 2, "fsdp=2, reshard_after_forward=false", ["switches.parallel.fsdp=2",
                                                        "switches.parallel.reshard_after_forward=false"]),
    ("tiny", 2, "tp=2", ["switches.parallel.tp=2"]),
    ("tiny", 4, "DDP", []),
    ("tiny", 4, "fsdp=4", ["switches.parallel.fsdp=4"]),
    ("tiny", 4, "fsdp=2 x tp=2", ["switches.parallel.fsdp=2", "switches.parallel.tp=2"]),
    ("tiny", 2, "pp=2 (1f1b, 2 micro-batches)", ["switches.parallel.pp=2", "switches.parallel.microbatches=2"]),
    ("tiny", 2, "pp=2 (1f1b, 4 micro-batches)", ["switches.parallel.pp=2", "switches.parallel.microbatches=4"]),
    ("tiny", 2, "pp=2 (1f1b, 8 micro-batches)", ["switches.parallel.pp=2", "switches.parallel.microbatches=8"]),
    ("tiny", 2, "pp=2 (gpipe, 4 micro-batches)", ["switches.parallel.pp=2", "switches.parallel.microbatches=4",
                                                  "switches.parallel.schedule=gpipe"]),
    ("small", 2, "DDP", []),
    ("small", 2, "fsdp=2", ["switches.parallel.fsdp=2"]),
    ("small", 2, "tp=2", ["switches.parallel.tp=2"]),
    ("small", 2, "tp=2, sequence_parallel", ["switches.parallel.tp=2", "switches.parallel.sequence_parallel=true"]),
    ("small", 2, "pp=2 (1f1b, 2 micro-batches)", ["switches.parallel.pp=2", "switches.parallel.microbatches=2"]),
    ("small", 2, "pp=2 (interleaved 1f1b, 2 chunks, 2 micro-batches)",
     ["switches.parallel.pp=2", "switches.parallel.microbatches=2", "switches.parallel.schedule=interleaved_1f1b"]),
    ("small", 4, "DDP", []),
    ("small", 4, "fsdp=4", ["switches.parallel.fsdp=4"]),
    ("small", 4, "fsdp=2 x tp=2", ["switches.parallel.fsdp=2", "switches.parallel.tp=2"]),
    ("small", 4, "fsdp=2 x pp=2 (1f1b, 2 micro-batches)", ["switches.parallel.fsdp=2", "switches.parallel.pp=2",
                                                          "switches.parallel.microbatches=2"]),
    ("small", 4, "tp=2 x pp=2, sequence_parallel (1f1b, 2 micro-batches)",
     ["switches.parallel.tp=2", "switches.parallel.sequence_parallel=true", "switches.parallel.pp=2",
      "switches.parallel.microbatches=2"]),
]

PLANNED = [  # 8 GPUs: (label, overrides)
    ("DDP (dp=8)", []),
    ("fsdp=8", ["switches.parallel.fsdp=8"]),
    ("fsdp=8, reshard_after_forward=false", ["switches.parallel.fsdp=8",
                                             "switches.parallel.reshard_after_forward=false"]),
    ("fsdp=4 x tp=2", ["switches.parallel.fsdp=4", "switches.parallel.tp=2"]),
    ("fsdp=4 x tp=2, sequence_parallel", ["switches.parallel.fsdp=4", "switches.parallel.tp=2",
                                          "switches.parallel.sequence_parallel=true"]),
    ("fsdp=4 x pp=2 (1f1b, 4 micro-batches)", ["switches.parallel.fsdp=4", "switches.parallel.pp=2",
                                               "switches.parallel.microbatches=4"]),
    ("tp=2 x pp=4 (gpipe, 4 micro-batches)", ["switches.parallel.tp=2", "switches.parallel.pp=4",
                                              "switches.parallel.schedule=gpipe", "switches.parallel.microbatches=4"]),
    ("fsdp=2 x pp=4 (interleaved 1f1b, 2 chunks, 4 micro-batches)",
     ["switches.parallel.fsdp=2", "switches.parallel.pp=4", "switches.parallel.schedule=interleaved_1f1b",
      "switches.parallel.microbatches=4"]),
]


def _mb(n: float | None) -> str:
    return fmt(None if n is None else n / 2**20, ".3f")


def _gb(n: float) -> str:
    return fmt(n / 1e9, ".1f")


def measure(preset: str, nproc: int, overrides: list[str], steps: int, runs_dir: Path) -> dict[str, Any]:
    base = [f"train.steps={steps}", "profile.warmup_steps=2"]
    cfg = load_config(preset=preset, overrides=base + overrides, nproc=nproc)
    run_dir = profile_run(cfg, runs_dir=runs_dir, nproc=nproc, progress=False)
    record = store.read_run(run_dir)
    if record["status"] != "completed":
        raise RuntimeError(f"{preset} {overrides} on {nproc} ranks: {record['status']}: {record.get('error')}")
    if "error" in record["diagnosis"]:
        raise RuntimeError(f"{preset} {overrides} on {nproc} ranks: diagnosis failed: {record['diagnosis']['error']}")
    held = [r["held_bytes"] for r in record["ranks"]]
    ranks = list(collectives_by_rank(record["summary"]).values())
    figures = {name: f["value"] for name, f in record["diagnosis"]["figures"].items()}
    par = cfg.switches.parallel
    p = plan(cfg, nproc)
    return {"tokens_per_s": record["summary"]["tokens_per_s"],
            "held": {part: max(h[part] for h in held) for part in ("params", "grads", "optimizer")},
            "peak_rss": record["summary"]["peak_memory_bytes"],
            "comm_bytes": max(sum(k["bytes"] for k in r["kinds"].values()) for r in ranks) if ranks else None,
            "comm_exposed": figures.get("comm_exposed"),
            "pipeline_wait": figures["comm_exposed.send_recv"] / figures["share.forward"] if par.pp > 1 else None,
            "bubble": p.bubble,
            "planned": p.per_rank_bytes, "planned_comm": p.comm_bytes_per_step["total"]}


def measured_section(steps: int) -> tuple[str, list[dict[str, Any]]]:
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ddp: dict[tuple[str, int], dict[str, Any]] = {}
        for preset, nproc, label, overrides in MEASURED:
            m = measure(preset, nproc, overrides, steps, Path(tmp))
            records.append({"preset": preset, "nproc": nproc, "layout": label, **m})
            ddp.setdefault((preset, nproc), m)
            base = ddp[(preset, nproc)]
            states = sum(m["held"].values())
            rows.append([f"{preset}, {nproc} ranks", label, fmt(m["tokens_per_s"], ",.0f"),
                         fmt(m["tokens_per_s"] / base["tokens_per_s"], ".2f"),
                         _mb(m["held"]["params"]), _mb(m["held"]["grads"]), _mb(m["held"]["optimizer"]),
                         fmt(states / sum(base["held"].values()), ".3f"),
                         f"{_mb(m['planned']['params'] + m['planned']['grads'] + m['planned']['optimizer'])}",
                         _mb(m["planned"]["activations"]), _mb(m["peak_rss"]),
                         _mb(m["comm_bytes"]), _mb(m["planned_comm"]), fmt(m["comm_exposed"], ".1f"),
                         "" if m["bubble"] is None else f"{100 * m['pipeline_wait']:.0f} / {100 * m['bubble']:.0f}"])
    text = table(["config", "layout", "tokens/s", "x DDP", "params held (MiB)", "grads held (MiB)",
                  "optimizer held (MiB)", "states x DDP", "plan: states (MiB)", "plan: activations (MiB)",
                  "peak RSS (MiB)", "comm/step (MiB)", "plan: comm/step (MiB)", "exposed comm (% of step)",
                  "pipeline: exposed send/recv / bubble (% of schedule)"], rows)
    return text, records


def planned_section() -> tuple[str, list[dict[str, Any]]]:
    rows, records = [], []
    h200 = int(GPUS_GB["h200"] * 1e9)
    for preset in ("glm-1.5b", "glm4-9b"):
        for ac in ("off", "full"):
            for label, overrides in PLANNED:
                cfg = load_config(preset=preset, nproc=8, check_here=False,
                                  overrides=overrides + [f"switches.activation_checkpointing.mode={ac}"])
                p = plan(cfg, 8, capacity_bytes=h200)
                b, c = p.per_rank_bytes, p.comm_bytes_per_step
                records.append({"preset": preset, "checkpointing": ac, "layout": label, **p.to_dict()})
                rows.append([preset, ac, label, _gb(b["params"]), _gb(b["grads"]), _gb(b["optimizer"]),
                             _gb(b["activations"]), _gb(b["buffers"]), _gb(b["total"]),
                             "yes" if p.fits else "NO", _gb(c["all_gather"]), _gb(c["reduce_scatter"]),
                             _gb(c["all_reduce"]), _gb(c["send_recv"]),
                             fmt(None if p.bubble is None else 100 * p.bubble, ".0f", na="")])
    text = table(["preset", "checkpointing", "layout (8 ranks)", "params (GB)", "grads (GB)", "optimizer (GB)",
                  "activations (GB)", "buffers (GB)", "total (GB)", "fits 141 GB", "all-gather/step (GB)",
                  "reduce-scatter/step (GB)", "all-reduce/step (GB)", "send/recv/step (GB)", "bubble (%)"], rows)
    return text, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 steps per run: checks that the script runs")
    parser.add_argument("--steps", type=int, help="steps per measured run (default 14: 9 outside the tiny "
                                                  "preset's profiler window)")
    args = parser.parse_args()
    steps = args.steps or (6 if args.quick else 14)
    planned_text, planned = planned_section()
    measured_text, measured = measured_section(steps)
    mode = "QUICK (do not quote)" if args.quick else (f"full ({steps} steps a run; tokens/s leaves out the first 2 "
                                                       "and the profiler window's)")
    text = (header("Parallel layouts: measured on CPU next to DDP, planned for 8 GPUs") + f"- mode: {mode}\n\n"
            "### Measured: torchrun over gloo on this CPU\n\n" + measured_text +
            "\n### Planned: `glmperf plan --preset P --nproc 8 --gpu h200 --set ...` (the preset's shipped config: "
            "its amp, batch and sequence length per rank)\n\n" + planned_text)
    write_result("parallel_layouts", text)
    (RESULTS_DIR / "parallel_layouts.json").write_text(json.dumps({"measured": measured, "planned": planned},
                                                                  indent=2, default=str))


if __name__ == "__main__":
    main()
