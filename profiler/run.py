"""Orchestrates one profiled run: run directory, ranks, instruments, status, summary.

`profile_run` is the whole life of a run. With one process everything happens here; with
`nproc > 1` this process creates the run, launches the ranks with torchrun (each rank runs
`python -m profiler.run --run-dir DIR` and writes only its own files), waits, and finalizes. A rank
that fails fails the run with that rank named; SIGINT/SIGTERM leave the run `interrupted`; a crash
leaves it `failed` with the error, also when it is the launcher's own. Either way every step
flushed before it stays readable.

The device is resolved once per process (`resolve_device` of train.device) and handed down: to
the environment record, the peak the MFU divides by, the setup context and the instruments.
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
import traceback
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from profiler import store
from profiler.analysis import RunData, load_run, summarize
from profiler.analysis.operators import precision_work
from profiler.config import ProfileConfig, RunConfig, build_run_config
from profiler.device import MATMUL_DTYPES, environment, matmul_peaks, matmul_speedup, run_peak
from profiler.instruments import Instrument, Sampler, StepTimer, TraceWindow, choose_backend
from profiler.instruments.comm import CommStats
from profiler.instruments.compile_watch import CompileWatch
from profiler.progress import Progress
from profiler.recommend import advise
from profiler.traces.importer import trace_summary
from reference_model.trainer import Trainer, TrainerHook, dist_env, resolve_device, setup_context


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so the run unwinds like Ctrl-C and is marked `interrupted`."""


def raise_interrupted(signum: int, frame: Any) -> None:
    """The SIGTERM handler of a run: the run unwinds as from Ctrl-C."""
    raise Interrupted(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
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


def instruments(profile: ProfileConfig, writer: store.RunWriter, *, device: torch.device, rank: int,
                comm: CommStats | None, compiled: bool = False) -> tuple[list[TrainerHook], dict]:
    """The default instruments of a run, and how the device is being sampled (for run.json).

    The same for the reference trainer and a user's own loop (profiler.api): step timer first,
    events, the sampler, the compile watch for a compiled model, the torch.profiler window last.
    """
    timer = StepTimer(writer, device=device, rank=rank, comm=comm)
    hooks: list[TrainerHook] = [timer, _Events(writer)]
    backend, why = choose_backend(device)
    sampling = {"source": backend.source, "why": why, "hz": profile.sample_hz}
    if profile.sample_hz > 0:
        hooks.append(Sampler(writer, backend, hz=profile.sample_hz, rank=rank, reason=why,
                             current_step=lambda: timer.current_step))
    else:
        backend.close()
    if compiled:
        hooks.append(CompileWatch(writer))
    if profile.trace:
        wait, warmup, active = profile.trace_window
        trace = TraceWindow(writer, device=device, rank=rank, wait=wait, warmup=warmup, active=active,
                            memory_snapshot=profile.memory_snapshot)
        timer.profiled = trace.is_active
        hooks.append(trace)
    return hooks, sampling


def rank_outcome(error: BaseException | None) -> tuple[str, dict[str, Any]]:
    """A rank's status from how its training ended, and the fields that say why."""
    if error is None:
        return "completed", {}
    if isinstance(error, KeyboardInterrupt):
        return "interrupted", {"error": str(error) or "KeyboardInterrupt"}
    return "failed", {"error": f"{type(error).__name__}: {error}",
                      "traceback": "".join(traceback.format_exception(error))}


class RankRecord:
    """One rank's part of a run: its writer, its hooks, and its status record (parts/status-r<rank>.json).

    The status says `running` (with this process's pid and host) from the start, so a reader of a
    live or killed run knows the ranks; `close` rewrites it with the outcome, after closing the
    instruments (their summaries go into the record) and flushing every buffered row.
    """

    def __init__(self, run_dir: Path, *, rank: int, flush_interval_s: float) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.writer = store.RunWriter(run_dir, rank=rank, flush_interval_s=flush_interval_s)
        self.fields: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname()}
        self.hooks: list[TrainerHook] = []
        store.write_rank_status(run_dir, rank, "running", **self.fields)

    def update(self, **fields: Any) -> None:
        self.fields.update(fields)
        store.write_rank_status(self.run_dir, self.rank, "running", **self.fields)

    def close(self, error: BaseException | None) -> str:
        """Close the instruments and the writer, write the outcome; returns the rank's status."""
        status, why = rank_outcome(error)
        self.fields.update(why)
        for hook in self.hooks:
            if isinstance(hook, Instrument):
                with contextlib.suppress(Exception):
                    hook.close()
                    self.fields.setdefault("instruments", {})[type(hook).__name__] = hook.summary()
        self.writer.close()
        store.write_rank_status(self.run_dir, self.rank, status, **self.fields)
        return status


def run_rank(run_dir: Path, cfg: RunConfig, *, device: torch.device, rank: int = 0, world_size: int = 1,
             progress: bool = True, extra_hooks: Sequence[TrainerHook] = ()) -> None:
    """Train this rank with its instruments; its outcome goes to its status record (RankRecord)."""
    record = RankRecord(run_dir, rank=rank, flush_interval_s=cfg.profile.flush_interval_s)
    error: BaseException | None = None
    try:
        with _sigterm_as_interrupt():
            comm = CommStats(device) if world_size > 1 and cfg.profile.instruments else None
            ctx = setup_context(cfg.train, cfg.data, device=device, rank=rank, world_size=world_size,
                                memory_budget_bytes=cfg.memory_budget_bytes,
                                wrap_comm_hook=comm.wrap if comm is not None else None)
            if cfg.profile.instruments:
                record.hooks, record.fields["sampling"] = instruments(
                    cfg.profile, record.writer, device=device, rank=rank, comm=comm,
                    compiled=cfg.switches.compile.mode != "off")
            if progress and rank == 0:
                record.hooks.append(Progress(total_steps=cfg.train.steps, every=cfg.train.log_every))
            record.hooks.extend(extra_hooks)
            trainer = Trainer(model_cfg=cfg.model, data_cfg=cfg.data, train_cfg=cfg.train,
                              switches=cfg.switches, hooks=record.hooks, run_dir=run_dir, ctx=ctx)
            record.update(flops_per_token=trainer.flops_per_token,
                          attention_flops_per_token=trainer.attention_flops_per_token, applied=trainer.setup.applied,
                          notes=trainer.setup.notes, num_params=trainer.model.num_params(),
                          start_step=trainer.start_step, torch_threads=torch.get_num_threads(),
                          loader_workers=int(trainer.setup.loader_options.get("num_workers", 0)))
            trainer.fit()
            record.update(held_bytes=trainer.held_bytes())  # this rank's params, grads, optimizer state
    except BaseException as exc:
        error = exc
        raise
    finally:
        record.close(error)


def _outcome(world_size: int, statuses: dict[int, dict[str, Any]], launcher_error: str | None
             ) -> tuple[str, str | None]:
    """The run's status and error from the ranks' records and what the launcher saw."""
    if not statuses and launcher_error:
        return "failed", f"the launch failed before any rank started: {launcher_error}"
    ended = {r: s for r, s in statuses.items() if s.get("status") != "running"}
    failed = [r for r in range(world_size) if ended.get(r, {}).get("status") == "failed"]
    silent = [r for r in range(world_size) if r not in ended]
    if silent and launcher_error:  # a rank killed outright is the root cause; others fail after it
        named = re.match(r"rank (\d+)", launcher_error)  # torchrun's report names the first failure
        root = int(named.group(1)) if named and int(named.group(1)) in silent else silent[0]
        error = f"rank {root} failed: it died without reporting a status ({launcher_error})"
        if failed:
            error += f"; then rank {failed[0]} failed: {ended[failed[0]].get('error')}"
        return "failed", error
    if failed:
        return "failed", f"rank {failed[0]} failed: {ended[failed[0]].get('error')}"
    if launcher_error:  # ranks it stopped say `interrupted`, but the launch is what failed
        return "failed", f"the launch failed: {launcher_error}"
    if any(s.get("status") == "interrupted" for s in ended.values()):
        return "interrupted", next(s.get("error") for s in ended.values() if s.get("error"))
    if silent:
        return "failed", f"rank {silent[0]} failed: it ended without reporting a status"
    return "completed", None


def finalize(run_dir: Path, *, launcher_error: str | None = None) -> dict[str, Any]:
    """Merge the ranks' files, decide the run's status, write the summary into run.json."""
    record = store.read_run(run_dir)
    world_size = int(record["world_size"])
    statuses = {s["rank"]: s for s in store.read_rank_statuses(run_dir)}
    store.compact(run_dir)
    status, error = _outcome(world_size, statuses, launcher_error)
    rank0 = statuses.get(0, {})
    fields: dict[str, Any] = {}
    if not record.get("peak"):  # ranks started elsewhere (init-run): measured here, now
        cfg = build_run_config(record["config"])
        fields.update(measured_peaks(resolve_device(cfg.train.device), cfg.switches.amp.dtype))
    if record.get("source", "profile-run") == "profile-run":
        fields.update(model={key: rank0.get(key) for key in ("num_params", "flops_per_token",
                                                             "attention_flops_per_token")},
                      switches_applied=rank0.get("applied", []), setup_notes=rank0.get("notes", []))
    else:  # a user's own model (profiler.api): what its rank recorded, and no switches to speak of
        fields["model"] = rank0.get("model") or record.get("model")
    store.update_run(
        run_dir, status=status, error=error, ended=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        ranks=list(statuses.values()), sampling=rank0.get("sampling"), **fields)
    run = load_run(run_dir)
    summary = summarize(run)
    store.update_run(run_dir, summary=summary)
    try:  # advice is a reading of what was measured: it must never cost the run its record
        store.update_run(run_dir, shape_speedup=shape_speedup(run))
        # the GPU's idle, overlap and launch figures as import reads them, and every rank's collectives
        if (run_device(run.record).type == "cuda" or run.world_size > 1) and (traced := trace_summary(run_dir)):
            store.update_run(run_dir, summary={**summary, "trace": traced})
        diagnosis = advise(load_run(run_dir))
    except Exception as exc:
        diagnosis = {"error": f"{type(exc).__name__}: {exc}"}
    return store.update_run(run_dir, diagnosis=diagnosis)


def shape_speedup(run: RunData) -> dict[str, float]:
    """The low-precision dtypes' speedup over fp32 at the run's own heaviest matmul and attention shapes, measured
    now on this machine (the run's is still warm): what switching precision would give this model."""
    work = precision_work(run)
    if not work:
        return {}
    device = run_device(run.record)
    kinds = ("bf16", "fp16") if device.type == "cuda" else ("bf16",)
    return {kind: matmul_speedup(device, work, MATMUL_DTYPES[kind]) for kind in kinds}


def run_device(record: dict[str, Any]) -> torch.device:
    """The device a stored run trained on: its config's for profile-run, the recorded one otherwise."""
    if record.get("source", "profile-run") == "profile-run":
        return resolve_device(build_run_config(record["config"]).train.device)
    return torch.device((record.get("environment") or {}).get("device", "cpu"))


def measured_peaks(device: torch.device, amp: str) -> dict[str, Any]:
    """run.json `peak` (the device's peak in the run's matmul dtype) and `matmul_peaks` (every dtype's)."""
    return {"peak": run_peak(device, amp), "matmul_peaks": matmul_peaks(device)}


def create_run_dir(cfg: RunConfig, *, runs_dir: Path | None, nproc: int, launcher: bool = True,
                   links: dict[str, Any] | None = None, device: torch.device | None = None) -> Path:
    """The run directory with run.json (`running`, the resolved config, this machine's environment).

    With `launcher`, the peak MFU divides by is measured now, before any rank starts, so even a
    run killed midway has its MFU. `launcher=False` when ranks are started elsewhere (`glmperf
    init-run`): no process of ours watches the run, so liveness is judged by the ranks' heartbeats
    alone, and the peak is measured at finalize. `links` are run.json fields that tie the run to
    what it was made for (`verifies`, `sweep`, `tune`). `device`: the run's, when the caller has
    resolved it already.
    """
    device = device if device is not None else resolve_device(cfg.train.device)
    record: dict[str, Any] = {"config": cfg.to_dict(), "world_size": nproc,
                              "environment": environment(device, world_size=nproc), **(links or {})}
    if launcher:
        record.update(measured_peaks(device, cfg.switches.amp.dtype))
    else:
        record["pid"] = None
    return store.create_run(store.default_runs_dir(runs_dir), cfg.name, record)


def profile_run(cfg: RunConfig, *, runs_dir: Path | None = None, nproc: int = 1, progress: bool = True,
                hooks: Sequence[TrainerHook] = (), links: dict[str, Any] | None = None) -> Path:
    """Run and measure `cfg`; returns the run directory (its run.json says how it ended).

    `hooks` are extra trainer hooks for a single-process run (your own callbacks). A failure of a
    rank is that rank's record; a failure of this process (the launcher) is the run's `error`.
    `links` go into run.json as they are (create_run_dir).
    """
    if hooks and nproc > 1:
        raise ValueError("extra hooks run in-process; with nproc > 1 the ranks are separate processes")
    device = resolve_device(cfg.train.device)
    run_dir = create_run_dir(cfg, runs_dir=runs_dir, nproc=nproc, links=links, device=device)
    launcher_error = None
    try:
        if nproc == 1:
            run_rank(run_dir, cfg, device=device, progress=progress, extra_hooks=hooks)
        else:
            launcher_error = _launch_ranks(run_dir, nproc, progress=progress)
    except KeyboardInterrupt:
        pass  # the ranks recorded `interrupted`; the run says so
    except Exception as exc:
        if nproc > 1:  # rank 0 in this process recorded its own failure; this one is the launcher's
            launcher_error = f"{type(exc).__name__}: {exc}"
    finally:
        finalize(run_dir, launcher_error=launcher_error)
    return run_dir


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


def _stop_orphans(run_dir: Path) -> list[int]:
    """SIGTERM ranks of this host still `running` after their launcher died (torchrun starts each in
    its own session, so they outlive it); returns their ranks."""
    stopped = []
    for status in store.read_rank_statuses(run_dir):
        if status.get("status") == "running" and status.get("host") == socket.gethostname() and status.get("pid"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(status["pid"]), signal.SIGTERM)
                stopped.append(int(status["rank"]))
    deadline = time.monotonic() + 30
    while stopped and time.monotonic() < deadline and any(
            s.get("status") == "running" and s["rank"] in stopped for s in store.read_rank_statuses(run_dir)):
        time.sleep(0.2)
    return stopped


def _launch_ranks(run_dir: Path, nproc: int, *, progress: bool) -> str | None:
    """torchrun the ranks and wait; returns what went wrong when the launch failed.

    torchrun's and the ranks' stderr go to the run's launcher.log, not a pipe: ranks left behind
    by a dead agent keep a pipe open, and waiting for its end would wait for them.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "profiler.run", "--run-dir", str(run_dir)] + ([] if progress else ["--no-progress"])
    threads = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    with store.launcher_log(run_dir) as log:
        proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": threads}, stderr=log)
        try:
            proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            raise
    if proc.returncode == 0:
        return None
    err = store.read_launcher_log(run_dir)
    sys.stderr.write(err[-4000:])
    if proc.returncode < 0:  # the agent itself was killed: its ranks may still be running
        stopped = _stop_orphans(run_dir)
        agent = f"the torchrun agent was killed by {signal.Signals(-proc.returncode).name}"
        return agent + (f"; rank(s) {', '.join(map(str, stopped))} stopped with it" if stopped else "")
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return torchrun_root_cause(err) or f"torchrun exited {proc.returncode}: {last}"


def rank_main(argv: list[str] | None = None) -> None:
    """Entry point of one rank under torchrun: the config comes from the run's run.json."""
    parser = argparse.ArgumentParser(prog="python -m profiler.run")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    cfg = build_run_config(store.read_run(args.run_dir)["config"])
    rank, world_size = dist_env()
    try:
        run_rank(args.run_dir, cfg, device=resolve_device(cfg.train.device), rank=rank, world_size=world_size,
                 progress=not args.no_progress)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    rank_main()
