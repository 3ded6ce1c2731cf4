"""How fast the dashboard answers with many stored runs: the Runs page (first load and after), a run page.

    python -m benchmarks.dashboard_speed [--runs N] [--rounds N]

One real `tiny` run is made and copied N times (each copy its own id), then Streamlit's AppTest
renders the pages in this process, as a server would: the first Runs load (imports, reading every
run.json), later loads (cached loaders), and opening a run page, first time and cached.
Targets: Runs page under 5 s first, under 2 s after; a run page under 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import fmt, header, median, mode_label, table, write_result

APP = Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py"


def _runs_dir(root: Path, copies: int) -> Path:
    from profiler.capture.run import profile_run
    from profiler.config import load_config

    runs = root / "runs"
    src = profile_run(load_config(preset="tiny", overrides=["train.steps=12"]), runs_dir=root / "src", progress=False)
    for i in range(copies):
        dest = Path(shutil.copytree(src, runs / f"{src.name[:-7]}-{i:06d}"))
        record = json.loads((dest / "run.json").read_text())
        (dest / "run.json").write_text(json.dumps({**record, "id": dest.name}))
    return runs


def _timed(page: str, **params: str) -> float:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=300)
    at.query_params.update(params)
    t0 = time.perf_counter()
    at.switch_page(f"app_pages/{page}.py").run()
    elapsed = time.perf_counter() - t0
    if at.exception:
        raise RuntimeError(f"{page} page raised: {[e.value for e in at.exception]}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int)
    p.add_argument("--rounds", type=int)
    p.add_argument("--quick", action="store_true", help="40 runs, 2 rounds")
    args = p.parse_args()
    mode = mode_label(args, ["runs", "rounds"])
    copies = args.runs or (40 if args.quick else 200)
    rounds = args.rounds or (2 if args.quick else 4)
    with tempfile.TemporaryDirectory() as tmp:
        runs = _runs_dir(Path(tmp), copies)
        os.environ["GLMPERF_RUNS"] = str(runs)
        run_id = sorted(p.name for p in runs.iterdir())[0]
        first = _timed("runs")
        later = [_timed("runs") for _ in range(rounds)]
        run_first = _timed("run", run=run_id)
        run_later = [_timed("run", run=run_id) for _ in range(rounds)]
    rows = [["Runs page, first load", fmt(first, ".2f"), "5"],
            ["Runs page, later loads (median)", fmt(median(later), ".2f"), "2"],
            ["a run page, first open", fmt(run_first, ".2f"), "2"],
            ["a run page, cached (median)", fmt(median(run_later), ".2f"), "2"]]
    text = header("Dashboard speed with many stored runs") + (
        f"- mode: {mode}\n- {copies} stored runs (copies of one `tiny --steps 12` run); Streamlit AppTest in one "
        f"process, {rounds} later loads each\n\n")
    text += table(["page", "seconds", "target (s)"], rows)
    write_result("dashboard_speed", text + "\n")


if __name__ == "__main__":
    main()
