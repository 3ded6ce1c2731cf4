"""Profile real CUDA runs and check what only a GPU can show; prints the figures (gpu_check.sh runs it)."""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler import store  # noqa: E402
from profiler.advice.plan import plan  # noqa: E402
from profiler.capture.run import profile_run  # noqa: E402
from profiler.config import build_run_config, load_config  # noqa: E402
from reference_model.hooks import StepRecord, TrainerHook  # noqa: E402

FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("  ok    " if ok else "  FAIL  ") + what)
    if not ok:
        FAILED.append(what)


class NoSync(TrainerHook):
    """Any synchronizing CUDA call raises from step `first` to the last: a default step never syncs.

    The last hook of the run, so every instrument's per-step work is inside the checked span.
    """

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last

    def on_step_start(self, step: int) -> None:
        if step == self.first:
            torch.cuda.set_sync_debug_mode("error")

    def on_step_end(self, record: StepRecord) -> None:
        if record.step == self.last:
            torch.cuda.set_sync_debug_mode("default")

    def on_train_end(self, result, error) -> None:
        torch.cuda.set_sync_debug_mode("default")


def run(runs_dir: Path, preset: str, overrides: list[str], nproc: int = 1, hooks=()) -> Path:
    cfg = load_config(preset=preset, overrides=["train.device=cuda", *overrides], nproc=nproc)
    run_dir = profile_run(cfg, runs_dir=runs_dir, nproc=nproc, progress=False, hooks=hooks)
    record = store.read_run(run_dir)
    s = record.get("summary") or {}
    st = s.get("step_time_s", {})
    print(f"\n{preset} {' '.join(overrides)} nproc={nproc}: status {record['status']} {record.get('error') or ''}")
    print(f"  tokens/s {s.get('tokens_per_s', math.nan):,.0f}  step p50 {st.get('p50', math.nan) * 1e3:.1f} ms  "
          f"p90 {st.get('p90', math.nan) * 1e3:.1f} ms  MFU {s.get('mfu', math.nan) * 100:.1f}% "
          f"(peak {s.get('peak_flops', math.nan) / 1e12:.0f} TFLOP/s, {s.get('peak_flops_source')})  "
          f"peak memory {(s.get('peak_memory_bytes') or 0) / 2**30:.2f} GiB")
    print(f"  phase share {json.dumps({k: round(v, 3) for k, v in s.get('phase_share', {}).items()})}")
    for part in [record, *(record.get("ranks") or [])]:
        if part.get("traceback"):
            print(part["traceback"])
    diagnosis = record.get("diagnosis") or {}
    for b in (diagnosis.get("bottlenecks") or [])[:2]:
        print(f"  bottleneck {b['kind']} (severity {b['severity']:.2f})")
    for r in (diagnosis.get("recommendations") or [])[:2]:
        print(f"  recommend {r['set']} expected {r['expected']}")
    check(record["status"] == "completed", "run completed")
    return run_dir


def check_single(run_dir: Path) -> None:
    steps = store.read_table(run_dir, "steps")
    record = store.read_run(run_dir)
    phases = [c for c in steps.columns if c.endswith("_s") and c not in ("step_s", "host_s", "comm_time_s")]
    check(bool((steps["mem_alloc_peak_bytes"] > 0).all()), "CUDA max_memory_allocated recorded every step")
    check(float((steps[phases].sum(axis=1) - steps["step_s"]).abs().max()) < 1e-6, "phases sum to step_s (events)")
    check(bool(steps["loss"].map(math.isfinite).all()), "losses finite (read lazily from the device)")
    timer = record["ranks"][0].get("instruments", {}).get("StepTimer", {})
    check(timer.get("unresolved_steps") == 0, "every CUDA event resolved")
    trace = json.loads(gzip.decompress((run_dir / "traces" / "rank0.json.gz").read_bytes()))
    check(any(e.get("cat") == "kernel" for e in trace["traceEvents"]), "trace holds GPU kernels")
    ops = store.read_table(run_dir, "ops")
    check(bool((ops[ops["name"].str.contains("mm")]["self_device_s"] > 0).any()), "ops have device time")
    check((run_dir / "traces" / "memory_snapshot_rank0.pickle").exists(), "allocator snapshot written")
    check(record["sampling"]["source"] == "nvml", f"NVML sampler used ({record['sampling']['why']})")
    samples = store.read_table(run_dir, "samples")
    check(bool((samples["gpu_util_pct"] > 0).any()), "NVML saw the GPU busy")
    gpu = ((record["summary"].get("trace") or {}).get("ranks") or {}).get("0") or {}
    print(f"  own trace as import reads it: {json.dumps({k: gpu.get(k) for k in ('temporal', 'idle')})}")
    check(0 < (gpu.get("temporal") or {}).get("idle_share", -1) < 1, "the run's own trace analyzed: GPU idle share")


def compare_plan(run_dir: Path, nproc: int) -> None:
    """`glmperf plan`'s per-rank bytes beside the allocator's peak of the run (printed, not checked: the
    allocator adds workspaces and fragmentation the plan leaves out, which this figure measures)."""
    record = store.read_run(run_dir)
    planned = plan(build_run_config(record["config"]), nproc).per_rank_bytes
    peak = float(store.read_table(run_dir, "steps")["mem_alloc_peak_bytes"].max())
    parts = "  ".join(f"{k} {v / 2**30:.2f}" for k, v in planned.items())
    print(f"  plan (GiB): {parts}; allocator peak {peak / 2**30:.2f} GiB = {peak / planned['total']:.2f}x plan")


def check_fsdp(ddp: Path, fsdp: Path) -> None:
    """fsdp=2 on two GPUs over NCCL: half of DDP's model states a rank, and its all-gathers and
    reduce-scatters in the traces."""
    held = [store.read_run(d)["ranks"][0]["held_bytes"] for d in (ddp, fsdp)]
    for part in ("params", "grads", "optimizer"):
        check(abs(held[1][part] / held[0][part] - 0.5) < 0.05, f"fsdp=2 holds half of DDP's {part}")
    ranks = (store.read_run(fsdp)["summary"].get("trace") or {}).get("ranks") or {}
    kinds = (ranks.get("0") or {}).get("collectives", {}).get("kinds", {})
    print(f"  collectives rank 0: {json.dumps({k: (f['calls'], f['bytes']) for k, f in kinds.items()})}")
    check({"all_gather", "reduce_scatter"} <= set(kinds), "NCCL all-gathers and reduce-scatters traced")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs-dir", type=Path, required=True)
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  CUDA {torch.version.cuda}")
    small = run(args.runs_dir, "small", ["switches.amp=bf16", "train.steps=40", "profile.memory_snapshot=true"])
    check_single(small)
    run(args.runs_dir, "small", ["train.steps=40"])  # fp32 beside bf16
    # a default step (every instrument but the trace window, whose start and stop are not steps'
    # work) must never make the host wait for the device
    run(args.runs_dir, "small", ["train.steps=20", "profile.trace=false"], hooks=[NoSync(3, 19)])
    big = run(args.runs_dir, "glm-350m", ["train.steps=30", "data.seq_len=1024", "train.batch_size=8"])
    compare_plan(big, 1)
    run(args.runs_dir, "glm-350m", ["train.steps=30", "data.seq_len=1024", "train.batch_size=8",
                                    "switches.compile=default"])
    if torch.cuda.device_count() >= 2:
        ddp = run(args.runs_dir, "small", ["switches.amp=bf16", "train.steps=30"], nproc=2)
        steps = store.read_table(ddp, "steps")
        check(steps["rank"].nunique() == 2 and bool((steps["comm_bytes"] > 0).all()), "NCCL comm counted per rank")
        fsdp = run(args.runs_dir, "small", ["switches.amp=bf16", "train.steps=30", "switches.parallel.fsdp=2"],
                   nproc=2)
        check_fsdp(ddp, fsdp)
        compare_plan(fsdp, 2)
    else:
        print("\n(one GPU: the NCCL 2-rank and fsdp=2 checks need two)")
    print(f"\n{len(FAILED)} failed: {FAILED}" if FAILED else "\nall checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
