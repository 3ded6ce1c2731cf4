"""Verifications started from the dashboard: `glmperf recommend RUN --verify` as a detached process.

A verification reruns a config several times and takes minutes, longer than a page lives: it runs in
its own session (a page reload or a closed tab does not stop it), writes its output to
`<runs_dir>/.dashboard/verify-<run id>.log`, and its pid and start time to
`verify-<run id>.json` beside it (the id made a plain file name), so any later page finds it, tells
whether it still runs, and shows the tail of its log. Only a run inside the runs directory is verified.
Its result lands where the command stores it: the verified run's run.json `diagnosis.verification`;
its runs link back through run.json `verifies.run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from profiler import store
from reports import paths

JOBS_DIR = ".dashboard"
CLI = "import sys; from profiler.cli import main; sys.exit(main())"
"""The glmperf command, run by this interpreter (no console script needed on PATH)."""


@dataclass(frozen=True)
class Job:
    """A verification started from the dashboard, as its JSON record says."""

    run_id: str
    pid: int
    started: float
    """Unix time the process was created (tells it apart from a later process given the same pid)."""
    command: list[str]
    log: Path

    @property
    def running(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.started) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def tail(self, lines: int = 15) -> str:
        """The last lines of its output (progress lines, then the verdicts)."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _paths(runs_dir: Path, run_id: str) -> tuple[Path, Path]:
    folder, name = runs_dir / JOBS_DIR, f"verify-{paths.plain_name(run_id)}"
    return folder / f"{name}.json", folder / f"{name}.log"


def command(run_id: str, runs_dir: Path, *, top: int, repeats: int, steps: int | None) -> list[str]:
    """The verification's command line (progress lines on: they are what the page shows)."""
    argv = [sys.executable, "-c", CLI, "recommend", run_id, "--verify", "--runs-dir", str(runs_dir), "--top", str(top),
            "--repeats", str(repeats)]
    return argv + (["--steps", str(steps)] if steps is not None else [])


def find(run_id: str, runs_dir: Path) -> Job | None:
    """The last verification of `run_id` started from the dashboard, running or not. Its log is the one
    beside its record, never a path the record names, and neither may be a link out of the runs directory:
    the page shows the log."""
    record, log = _paths(runs_dir, run_id)
    if not (paths.inside(record, runs_dir) and paths.inside(log, runs_dir)):
        return None
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        return Job(run_id, int(data["pid"]), float(data["started"]), list(data["command"]), log)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def start(run_id: str, runs_dir: Path, *, top: int = 3, repeats: int = 3, steps: int | None = None) -> Job:
    """Start verifying `run_id` unless a verification of it already runs (then that one is returned);
    StoreError when it names no run inside the runs directory."""
    paths.served_run(run_id, runs_dir)
    current = find(run_id, runs_dir)
    if current is not None and current.running:
        return current
    record, log = _paths(runs_dir, run_id)
    record.parent.mkdir(parents=True, exist_ok=True)
    if not paths.inside(record.parent, runs_dir):
        raise store.StoreError(f"{JOBS_DIR} in the runs directory is a symbolic link: verifications write there")
    argv = command(run_id, runs_dir, top=top, repeats=repeats, steps=steps)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)  # never through a link
    with open(fd, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.Error:  # it ended already (bad input): its log says why
        started = time.time()
    store.write_json_atomic(record, {"run": run_id, "pid": proc.pid, "started": started, "command": argv,
                                     "log": str(log)})
    return Job(run_id, proc.pid, started, argv, log)
