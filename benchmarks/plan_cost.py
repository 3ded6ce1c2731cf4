"""What a run costs beyond its training steps: alone (`profile-run`, a fresh process), and as a cell of a
plan (verify, sweep, tune: cells one after another in one warm process, profiler.experiments.batch).

    python -m benchmarks.plan_cost [--quick]

For each, the wall time, the training span (from the first step's start to the last step's end, read
from steps.parquet) and the difference: start-up, model and data build, finalize (summary,
diagnosis, the run's matmul shapes timed), and, in a traced run, the trace's export and operator
table. In a plan only a config's first repeat is traced (profiler.experiments.batch.traced_once).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.common import fmt, header, median, mode_label, table, write_result
from benchmarks.overhead import end_to_end
from profiler import store
from profiler.config import load_config
from profiler.experiments.batch import Cell, run_cells, traced_once


def training_span(run_dir: Path) -> float:
    steps = store.read_table(run_dir, "steps")
    first_start = float(steps["ts_end"].iloc[0] - steps["host_s"].iloc[0])
    return float(steps["ts_end"].iloc[-1]) - first_start


def warm_cells(runs_dir: Path, steps: int, repeats: int) -> list[list[object]]:
    cfg = load_config(preset="tiny", overrides=[f"train.steps={steps}"])
    # every third cell traced, as a plan traces each config's first repeat
    cells = [Cell(f"repeat {r}", traced_once(cfg, r % 3)) for r in range(repeats)]
    rows, t0 = [], time.perf_counter()
    beyond: dict[str, list[float]] = {"traced": [], "untraced": []}
    for i, (cell, run_dir) in enumerate(run_cells(cells, runs_dir=runs_dir, progress=False)):
        wall, t0 = time.perf_counter() - t0, time.perf_counter()
        span = training_span(run_dir)
        kind = "traced" if cell.cfg.profile.trace else "untraced"
        role = "first cell of the process" if i == 0 else f"cell {i + 1}"
        if i:  # the first cell also fills the process's caches
            beyond[kind].append(wall - span)
        rows.append([f"{role} ({kind})", fmt(wall, ".2f"), fmt(span, ".2f"), fmt(wall - span, ".2f")])
    for kind, values in beyond.items():
        if values:
            rows.append([f"median of later {kind} cells", "", "", fmt(median(values), ".2f")])
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20 steps, 3 cells")
    p.add_argument("--steps", type=int)
    p.add_argument("--repeats", type=int)
    args = p.parse_args()
    mode = mode_label(args, ["steps", "repeats"])
    steps = args.steps or (20 if args.quick else 50)
    repeats = args.repeats or (3 if args.quick else 6)
    with tempfile.TemporaryDirectory() as tmp:
        cold = end_to_end(Path(tmp) / "cold", steps)
        warm = warm_cells(Path(tmp) / "warm", steps, repeats)
    text = header("What a run costs beyond its training steps") + f"- mode: {mode}\n\n"
    text += "## Alone: `profile-run` in a fresh process (seconds)\n\n"
    text += table(["command", "wall", "start-up", "training", "finalize"], cold)
    text += f"\n\n## As cells of a plan: {repeats} cells of `tiny --steps {steps}` in one process (seconds)\n\n"
    text += table(["cell", "wall", "training span", "beyond its steps"], warm)
    write_result("plan_cost", text + "\n")


if __name__ == "__main__":
    main()
