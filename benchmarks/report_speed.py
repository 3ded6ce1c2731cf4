"""How long writing a report takes, and how big the file is, for the runs a user makes.

    python -m benchmarks.report_speed [--quick]

Two runs are made first (not timed): the `small` preset as `make demo` runs it (60 steps), and a
200-step `tiny` run with two ranks (`--nproc 2`, gloo), whose steps, samples and communication
tables are the largest the reports draw. For each, the report is written:

- in process, as profile-run's hook does at the end of a run (libraries already imported): the
  median of 5 writes;
- cold, as a user types `glmperf report RUN`: a new process, imports included (median of 3).

Target: under 3 s and under 6 MB each. plotly.js, inlined once, is most of the size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import header, median, table, write_result
from profiler.capture.run import profile_run
from profiler.config import load_config

TARGET_S, TARGET_MB = 3.0, 6.0


def _runs(root: Path, quick: bool) -> dict[str, Path]:
    small = load_config(preset="small", overrides=["train.steps=8"] if quick else [])
    ranks = load_config(preset="tiny", overrides=[f"train.steps={20 if quick else 200}"], nproc=2)
    return {f"small ({small.train.steps} steps)": profile_run(small, runs_dir=root, progress=False),
            f"tiny, 2 ranks ({ranks.train.steps} steps)": profile_run(ranks, runs_dir=root, nproc=2, progress=False)}


def _in_process(run_dir: Path, out: Path, repeats: int) -> list[float]:
    from reports.cli import write_run_report

    write_run_report(run_dir, out)  # the first write loads the templates and plotly.js
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        write_run_report(run_dir, out)
        times.append(time.perf_counter() - t0)
    return times


def _cold(run_dir: Path, out: Path, repeats: int) -> list[float]:
    cmd = [sys.executable, "-c", "import sys; from profiler.cli import main; sys.exit(main())", "report",
           str(run_dir), "-o", str(out)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs, one write each: checks the script runs")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for label, run_dir in _runs(root / "runs", args.quick).items():
            out = root / f"{run_dir.name}.html"
            warm = median(_in_process(run_dir, out, 1 if args.quick else 5))
            cold = median(_cold(run_dir, out, 1 if args.quick else 3))
            mb = out.stat().st_size / 1e6
            ok = "yes" if max(warm, cold) < TARGET_S and mb < TARGET_MB else "NO"
            rows.append([label, f"{warm:.2f}", f"{cold:.2f}", f"{mb:.2f}", ok])
    mode = "QUICK (short runs: do not quote its figures)" if args.quick else "full"
    text = (header("Report speed and size") + f"- mode: {mode}\n\n"
            + table(["run", "write in process (s)", "glmperf report, cold (s)", "file (MB)",
                     f"under {TARGET_S:g} s and {TARGET_MB:g} MB"], rows)
            + "\nIn process: profile-run's hook at the end of a run (median of 5). Cold: a new `glmperf report` "
              "process, Python and library imports included (median of 3). Size: one self-contained file, "
              "plotly.js (about 4.7 MB) inlined once.\n")
    write_result("report_speed", text)


if __name__ == "__main__":
    main()
