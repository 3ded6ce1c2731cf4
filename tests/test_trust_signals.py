"""What a run says when it is stopped from outside: signals to the launcher or to one rank, and a
launcher killed outright; and that a profiled run prints only what glmperf means to say."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from profiler import store
from tests.conftest import ROOT, TINY

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


NOISE = ("Memory block of unknown size", "USDT", "profiler_start", "profiler_stop")

TWO_TRACED_RUNS = """
import sys
from pathlib import Path
from profiler.capture.run import profile_run
from profiler.config import load_config
for _ in range(2):  # as a sweep or a verification does: several profiled runs in one process
    profile_run(load_config(preset="tiny", overrides=sys.argv[2:]), runs_dir=Path(sys.argv[1]), progress=False)
"""


def test_profiled_runs_print_none_of_torchs_profiler_noise(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", TWO_TRACED_RUNS, str(tmp_path), *TINY, "train.steps=5"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    runs = store.list_runs(tmp_path)
    assert len(runs) == 2 and all(r["status"] == "completed" for r in runs)
    assert all(store.trace_paths(Path(r["path"])) for r in runs)  # the window did profile, twice
    output = done.stdout + done.stderr
    assert not [line for line in output.splitlines() if any(n in line for n in NOISE)], output


FILTERED = """
import os
from profiler.instruments.torch_profiler import UNKNOWN_BLOCK, StderrFilter
quiet = StderrFilter(UNKNOWN_BLOCK)
os.write(2, b"before\\n[W1206 03:55:27.070695074 CPUAllocator.cpp:245] Memory block of unknown size was allocated "
            b"before the profiling started, profiler results will not include the deallocation event\\nafter")
quiet.close()
os.write(2, b" and on\\n")
"""


def test_the_stderr_filter_drops_that_line_alone() -> None:
    done = subprocess.run([sys.executable, "-c", FILTERED], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stderr == b"before\nafter and on\n"
