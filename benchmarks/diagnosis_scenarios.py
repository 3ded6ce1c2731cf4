"""Does the diagnosis find the bottleneck we induced, and stay silent on healthy runs?

    python -m benchmarks.diagnosis_scenarios [--threads N] [--steps N]

Each scenario is a real `profile-run` (a subprocess, as a user runs it) of the `tiny` or `small`
preset with one bottleneck induced on purpose; the table gives the first diagnosis, its evidence,
the top recommendation and its expected gain. The healthy controls are the presets as shipped
(`small` with bf16 where the CPU has native bf16); a false positive is any induced kind found on
them. tests/test_diagnose_scenarios.py runs the same scenarios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiler.instruments.machine import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
NATIVE_BF16 = bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str
    """The bottleneck kind induced (or "" for a healthy control)."""
    preset: str
    overrides: tuple[str, ...] = ()
    nproc: int = 1
    skip: str = ""
    """Why the scenario cannot be induced on this machine ("" when it can)."""
    consequences: tuple[str, ...] = ()
    """Other induced kinds the induced one causes (found after it, they are not false positives)."""


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("input: 30 ms loader delay", "input_bound", "tiny", ("data.io_delay_ms=30",)),
    Scenario("memory: budget below the peak", "memory_bound", "tiny", ("profile.memory_budget_gb=0.25",)),
    Scenario("host: batch 1 of 8 tokens", "host_bound", "tiny", ("train.batch_size=1", "data.seq_len=8")),
    Scenario("comm: 2 gloo ranks, 10 KB buckets", "comm_bound", "tiny", ("switches.ddp.bucket_cap_mb=0.01",), nproc=2),
    Scenario("unstable: lr 1000", "unstable", "tiny", ("train.lr=1000", "switches.lr_schedule.warmup_steps=0")),
    # 1024-token attention makes matmuls big enough that bf16 nears its 1.3x threshold at the run's
    # shapes on a CPU with native bf16: found after attention_bound there, a consequence, and true
    Scenario("attention: 1024 tokens", "attention_bound", "tiny", ("data.seq_len=1024", "train.batch_size=2"),
             consequences=("low_precision_unused",) if NATIVE_BF16 else ()),
    Scenario("low precision unused: small fp32", "low_precision_unused", "small", (),
             skip="" if NATIVE_BF16 else "this CPU has no native bf16 (no avx512_bf16/amx_bf16): nothing to gain"),
    Scenario("precision emulated: tiny bf16", "precision_emulated", "tiny", ("switches.amp=bf16",),
             skip="this CPU runs bf16 natively: bf16 is not emulated here" if NATIVE_BF16 else ""),
    # torch caps its own threads at the cores, so loader workers do it; they compete with training
    # for the cores, and batches arriving late show as data wait: a consequence, not a false positive
    Scenario("cpu oversubscribed: loader workers", "cpu_oversubscribed", "tiny",
             (f"switches.dataloader.num_workers={(os.cpu_count() or 1) + 2}",), consequences=("input_bound",)),
    Scenario("checkpoint: save every step", "checkpoint_bound", "tiny", ("switches.checkpoint.every=1",)),
)
CONTROLS: tuple[Scenario, ...] = (
    Scenario("healthy tiny", "", "tiny"),
    Scenario("healthy small", "", "small", ("switches.amp=bf16",) if NATIVE_BF16 else ()),
)
INDUCED = tuple(s.kind for s in SCENARIOS)


def run(scenario: Scenario, runs_dir: Path, *, steps: int, threads: int | None = None) -> dict[str, Any]:
    """profile-run the scenario in a subprocess; its run.json (with the diagnosis)."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    cmd = [sys.executable, "-m", "profiler.cli", "--preset", scenario.preset, "--no-progress", "--json",
           "--runs-dir", str(runs_dir), "--nproc", str(scenario.nproc), "--steps", str(steps),
           *[f"--set={o}" for o in scenario.overrides]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    shown = json.loads(proc.stdout)
    return json.loads((Path(shown["path"]) / "run.json").read_text())


def _evidence(finding: dict[str, Any]) -> str:
    return "; ".join(f"{name} {e['value']:.3g} {e['unit']}" for name, e in list(finding["evidence"].items())[:2])


def _top(record: dict[str, Any]) -> tuple[str, str]:
    recs = record["diagnosis"]["recommendations"]
    if not recs:
        return "none (no switch addresses it here)", ""
    from profiler.text import expected_text

    return " ".join(f"{k}={v}" for k, v in recs[0]["set"].items()), expected_text(recs[0]).split("  [")[0]


def main() -> None:
    from benchmarks.common import header, table, write_result

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the runs (default: the machine's)")
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()
    rows, false_positives = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for s in (*SCENARIOS, *CONTROLS):
            if s.skip:
                rows.append([s.name, s.kind, f"skipped: {s.skip}", "", "", "", ""])
                continue
            print(f"  {s.name} ...", file=sys.stderr, flush=True)
            record = run(s, Path(tmp), steps=args.steps, threads=args.threads)
            found = record["diagnosis"]["bottlenecks"]
            first = found[0] if found else None
            wrong = [b["kind"] for b in found if b["kind"] in INDUCED and b["kind"] not in (s.kind, *s.consequences)]
            false_positives += len(wrong)
            change, gain = _top(record)
            rows.append([s.name, s.kind or "none (control)",
                         f"{first['kind']} ({100 * first['severity']:.0f}%)" if first else "no bottleneck found",
                         _evidence(first) if first else record["diagnosis"]["verdict"],
                         ", ".join(wrong) or "-", change, gain])
    text = header("Diagnosis scenarios") + (
        f"- each row: one `profile-run --steps {args.steps}` with the bottleneck induced; `other induced kinds` "
        "lists any induced kind found that the row did not induce (a false positive)\n\n")
    text += table(["scenario", "induced", "first diagnosis (severity)", "evidence", "other induced kinds found",
                   "top recommendation", "expected gain"], rows)
    text += f"\nFalse positives (induced kinds found where not induced, controls included): {false_positives}\n"
    write_result("diagnosis_scenarios", text)


if __name__ == "__main__":
    main()
