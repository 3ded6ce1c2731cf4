"""Orchestrates one profiled run: run directory, ranks, instruments, status, summary.

`profile_run` is the whole life of a run. With one process everything happens here; with
`nproc > 1` this process creates the run, launches the ranks with torchrun (each rank runs
`python -m profiler.run --run-dir DIR` and writes only its own files), waits, and finalizes. A rank
that fails fails the run with that rank named; SIGINT/SIGTERM leave the run `interrupted`; a crash
leaves it `failed` with the error. Either way every step flushed before it stays readable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from profiler import store
from profiler.analysis.summary import summarize
from profiler.config import RunConfig, build_run_config
from profiler.device import environment, peak_flops
from profiler.instruments import Instrument, Sampler, StepTimer, TraceWindow, choose_backend
from profiler.progress import Progress
from reference_model.trainer import Trainer, TrainerHook, dist_env, resolve_device


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so the run unwinds like Ctrl-C and is marked `interrupted`."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Events(TrainerHook):
    """Trainer events (NaN, spikes, checkpoints, batch-size changes) straight to events.jsonl."""

    def __init__(self, writer: store.RunWriter) -> None:
        self.writer = writer

    def on_event(self, event: dict[str, Any]) -> None:
        self.writer.add_event(event)


def _instruments(cfg: RunConfig, writer: store.RunWriter, *, rank: int) -> tuple[list[TrainerHook], dict]:
    """The default instruments for this run, and how the device is being sampled (for run.json)."""
    device = resolve_device(cfg.train.device)
    timer = StepTimer(writer, device=device, rank=rank)
    hooks: list[TrainerHook] = [timer, _Events(writer)]
    backend, why = choose_backend(device)
    sampling = {"source": backend.source, "why": why, "hz": cfg.profile.sample_hz}
    if cfg.profile.sample_hz > 0:
        hooks.append(Sampler(writer, backend, hz=cfg.profile.sample_hz, rank=rank, reason=why,
                             current_step=lambda: timer.current_step))
    else:
        backend.close()
    if cfg.profile.trace:
        wait, warmup, active = cfg.profile.trace_window
        trace = TraceWindow(writer, device=device, rank=rank, wait=wait, warmup=warmup, active=active,
                            memory_snapshot=cfg.profile.memory_snapshot)
        timer.profiled = trace.is_active
        hooks.append(trace)
    return hooks, sampling


def run_rank(run_dir: Path, cfg: RunConfig, *, rank: int, progress: bool,
             extra_hooks: Sequence[TrainerHook] = ()) -> None:
    """Train this rank with its instruments; record the rank's outcome in parts/status-r<rank>.json."""
    writer = store.RunWriter(run_dir, rank=rank, flush_interval_s=cfg.profile.flush_interval_s)
    hooks: list[TrainerHook] = []
    status, fields = "failed", {}
    try:
        with _sigterm_as_interrupt():
            if cfg.profile.instruments:
                hooks, fields["sampling"] = _instruments(cfg, writer, rank=rank)
            if progress and rank == 0:
                hooks.append(Progress(total_steps=cfg.train.steps, every=cfg.train.log_every))
            hooks.extend(extra_hooks)
            trainer = Trainer(model_cfg=cfg.model, data_cfg=cfg.data, train_cfg=cfg.train,
                              switches=cfg.switches, hooks=hooks, run_dir=run_dir,
                              memory_budget_bytes=cfg.memory_budget_bytes)
            fields.update(flops_per_token=trainer.flops_per_token, applied=trainer.setup.applied,
                          notes=trainer.setup.notes, num_params=trainer.model.num_params(),
                          start_step=trainer.start_step)
            trainer.fit()
        status = "completed"
    except KeyboardInterrupt as exc:
        status, fields["error"] = "interrupted", str(exc) or "KeyboardInterrupt"
        raise
    except BaseException as exc:
        fields["error"] = f"{type(exc).__name__}: {exc}"
        fields["traceback"] = traceback.format_exc()
        raise
    finally:
        for hook in hooks:
            if isinstance(hook, Instrument):
                with contextlib.suppress(Exception):
                    hook.close()
                    fields.setdefault("instruments", {})[type(hook).__name__] = hook.summary()
        writer.close()
        store.write_rank_status(run_dir, rank, status, **fields)


def finalize(run_dir: Path, cfg: RunConfig, *, world_size: int, launcher_error: str | None = None
             ) -> dict[str, Any]:
    """Merge the ranks' files, decide the run's status, write the summary into run.json."""
    statuses = {s["rank"]: s for s in store.read_rank_statuses(run_dir)}
    store.compact(run_dir)
    failed = [r for r in range(world_size) if statuses.get(r, {}).get("status") == "failed"]
    silent = [r for r in range(world_size) if r not in statuses]
    if silent and launcher_error:  # a rank killed outright is the root cause; others fail after it
        status = "failed"
        error = f"rank {silent[0]} failed: it died without reporting a status ({launcher_error})"
        if failed:
            error += f"; then rank {failed[0]} failed: {statuses[failed[0]].get('error')}"
    elif failed:
        status, error = "failed", f"rank {failed[0]} failed: {statuses[failed[0]].get('error')}"
    elif any(s.get("status") == "interrupted" for s in statuses.values()):
        status, error = "interrupted", next(s.get("error") for s in statuses.values() if s.get("error"))
    elif silent:
        status, error = "failed", f"rank {silent[0]} failed: it ended without reporting a status"
    else:
        status, error = "completed", None
    rank0 = statuses.get(0, {})
    device = resolve_device(cfg.train.device)
    dtype = torch.bfloat16 if cfg.switches.amp.dtype != "off" else torch.float32
    peak, peak_source = peak_flops(device, dtype)
    steps = store.read_table(run_dir, "steps")
    summary = summarize(steps, warmup_steps=cfg.profile.warmup_steps,
                        flops_per_token=rank0.get("flops_per_token", float("nan")), peak_flops=peak,
                        world_size=world_size, samples=store.read_table(run_dir, "samples"))
    summary["peak_flops_source"] = peak_source
    return store.update_run(
        run_dir, status=status, error=error, ended=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        summary=summary, ranks=list(statuses.values()),
        model={"num_params": rank0.get("num_params"), "flops_per_token": rank0.get("flops_per_token")},
        switches_applied=rank0.get("applied", []), setup_notes=rank0.get("notes", []),
        sampling=rank0.get("sampling"))


def create_run_dir(cfg: RunConfig, *, runs_dir: Path | None, nproc: int, launcher: bool = True) -> Path:
    """The run directory with run.json (`running`, the resolved config, this machine's environment).

    `launcher=False` when ranks are started elsewhere (`glmperf init-run`): no process of ours
    watches the run, so liveness is judged by the ranks' heartbeats alone.
    """
    record = {"config": cfg.to_dict(), "world_size": nproc,
              "environment": environment(resolve_device(cfg.train.device)), **({} if launcher else {"pid": None})}
    return store.create_run(store.default_runs_dir(runs_dir), cfg.name, record)


def profile_run(cfg: RunConfig, *, runs_dir: Path | None = None, nproc: int = 1, progress: bool = True,
                hooks: Sequence[TrainerHook] = ()) -> Path:
    """Run and measure `cfg`; returns the run directory (its run.json says how it ended).

    `hooks` are extra trainer hooks for a single-process run (your own callbacks).
    """
    if hooks and nproc > 1:
        raise ValueError("extra hooks run in-process; with nproc > 1 the ranks are separate processes")
    run_dir = create_run_dir(cfg, runs_dir=runs_dir, nproc=nproc)
    launcher_error = None
    try:
        if nproc == 1:
            run_rank(run_dir, cfg, rank=0, progress=progress, extra_hooks=hooks)
        else:
            launcher_error = _launch_ranks(run_dir, nproc, progress=progress)
    except BaseException:  # noqa: S110 - the rank recorded `failed`/`interrupted` and the error
        pass
    finally:
        finalize(run_dir, cfg, world_size=nproc, launcher_error=launcher_error)
    return run_dir


def _launch_ranks(run_dir: Path, nproc: int, *, progress: bool) -> str | None:
    """torchrun the ranks and wait; returns the launcher's complaint when it failed."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "profiler.run", "--run-dir", str(run_dir)] + ([] if progress else ["--no-progress"])
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                                                       // nproc)))}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        raise
    if proc.returncode != 0:
        sys.stderr.write(err[-4000:])
        return f"torchrun exited {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"
    return None


def rank_main(argv: list[str] | None = None) -> None:
    """Entry point of one rank under torchrun: the config comes from the run's run.json."""
    parser = argparse.ArgumentParser(prog="python -m profiler.run")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    record = json.loads((args.run_dir / "run.json").read_text(encoding="utf-8"))
    cfg = build_run_config(record["config"])
    rank, _ = dist_env()
    try:
        run_rank(args.run_dir, cfg, rank=rank, progress=not args.no_progress)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    rank_main()
