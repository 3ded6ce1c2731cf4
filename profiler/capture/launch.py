"""Ranks started with torchrun: the launch, its failure report, orphaned ranks, and the rank's entry point
(`python -m profiler.run --run-dir DIR`, also what a user runs on each node of a run made by
`glmperf init-run`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from profiler import store
from profiler.capture.ranks import run_rank, signals_ignored, sigterm_as_interrupt
from profiler.config import build_run_config
from reference_model.context import dist_env, resolve_device


def torchrun_root_cause(stderr: str) -> str | None:
    """The first failed rank as torchrun's failure report names it: rank, exit code, and why."""
    report = stderr.split("Root Cause (first observed failure):", 1)
    if len(report) < 2:
        return None
    block = report[1]
    fields = dict(re.findall(r"^\s*(rank|exitcode|traceback)\s*:\s*(.+?)\s*$", block, re.M)[:3])
    if "rank" not in fields:
        return None
    text = f"rank {fields['rank']} exited with code {fields.get('exitcode', '?')}"
    why = fields.get("traceback", "")
    return f"{text}: {why}" if why and not why.startswith("To enable traceback") else text


STOP_GRACE_S = 20.0
"""How long torchrun, then its orphaned ranks, get to stop (each rank records `interrupted`) before they are
killed: what bounds the launcher's exit after SIGTERM or Ctrl-C."""


def _stop_orphans(run_dir: Path) -> list[int]:
    """SIGTERM ranks of this host still `running` once their torchrun agent is gone (torchrun starts each
    in its own session, so they outlive it) and wait for them to end; returns their ranks."""
    stopped = []
    for status in store.read_rank_statuses(run_dir):
        if status.get("status") == "running" and status.get("host") == socket.gethostname() and status.get("pid"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(status["pid"]), signal.SIGTERM)
                stopped.append(int(status["rank"]))
    deadline = time.monotonic() + STOP_GRACE_S
    while stopped and time.monotonic() < deadline and any(
            s.get("status") == "running" and s["rank"] in stopped for s in store.read_rank_statuses(run_dir)):
        time.sleep(0.2)
    return stopped


def _stop(proc: subprocess.Popen, run_dir: Path) -> None:
    """Stop torchrun and its ranks, within a bound: SIGTERM to the agent (it stops the ranks the same way,
    and they record `interrupted`), SIGKILL to it and SIGTERM to its leftover ranks after STOP_GRACE_S.
    Further signals are ignored meanwhile, so that a second Ctrl-C does not leave ranks behind."""
    with signals_ignored(signal.SIGTERM, signal.SIGINT):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            _stop_orphans(run_dir)


def launch_ranks(run_dir: Path, nproc: int, *, progress: bool) -> str | None:
    """torchrun the ranks and wait; returns what went wrong when the launch failed, None when the ranks' own
    records say how the run ended.

    torchrun's and the ranks' stderr go to the run's launcher.log, not a pipe: ranks left behind
    by a dead agent keep a pipe open, and waiting for its end would wait for them. SIGTERM or Ctrl-C
    here stop torchrun and the ranks (`_stop`) and raise KeyboardInterrupt.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "profiler.run", "--run-dir", str(run_dir)] + ([] if progress else ["--no-progress"])
    threads = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    with store.launcher_log(run_dir) as log, sigterm_as_interrupt():
        proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": threads}, stderr=log)
        try:
            proc.wait()
        except KeyboardInterrupt:
            _stop(proc, run_dir)
            raise
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:  # the agent itself was killed: its ranks may still be running
        stopped = _stop_orphans(run_dir)
        agent = f"the torchrun agent was killed by {signal.Signals(-proc.returncode).name}"
        return agent + (f"; rank(s) {', '.join(map(str, stopped))} stopped with it" if stopped else "")
    ended = [s["status"] for s in store.read_rank_statuses(run_dir) if s.get("status") != "running"]
    if len(ended) == nproc and set(ended) != {"completed"}:  # the ranks' records say why, cause first
        return None
    err = store.read_launcher_log(run_dir)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return torchrun_root_cause(err) or f"torchrun exited {proc.returncode}: {last}"


def rank_main(argv: list[str] | None = None) -> None:
    """Entry point of one rank under torchrun: the config comes from the run's run.json."""
    parser = argparse.ArgumentParser(prog="python -m profiler.run")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    record = store.read_run(args.run_dir)
    cfg = build_run_config(record["config"])
    rank, world_size = dist_env()
    launcher = record.get("pid") if record.get("host") == os.uname().nodename else None  # None: init-run's
    try:
        run_rank(args.run_dir, cfg, device=resolve_device(cfg.train.device), rank=rank, world_size=world_size,
                 progress=not args.no_progress, launcher=launcher)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
