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
from profiler.config import load_config  # noqa: E402
from profiler.run import profile_run  # noqa: E402
from reference_model.trainer import StepRecord, TrainerHook  # noqa: E402

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
    check(0 < (gpu.get("temporal") or {}).get("idle_share", -1) < 1, "the run's own trace analysed: GPU idle share")


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
    run(args.runs_dir, "glm-350m", ["train.steps=30", "data.seq_len=1024", "train.batch_size=8"])
    run(args.runs_dir, "glm-350m", ["train.steps=30", "data.seq_len=1024", "train.batch_size=8",
                                    "switches.compile=default"])
    if torch.cuda.device_count() >= 2:
        ddp = run(args.runs_dir, "small", ["switches.amp=bf16", "train.steps=30"], nproc=2)
        steps = store.read_table(ddp, "steps")
        check(steps["rank"].nunique() == 2 and bool((steps["comm_bytes"] > 0).all()), "NCCL comm counted per rank")
    else:
        print("\n(one GPU: the NCCL 2-rank check needs two)")
    print(f"\n{len(FAILED)} failed: {FAILED}" if FAILED else "\nall checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
