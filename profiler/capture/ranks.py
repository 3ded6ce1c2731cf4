"""One rank of a run: its instruments, its status record, and its training.

Each rank writes only its own files (parts/, status-r<rank>.json), so a rank that dies leaves every
step it flushed readable and the others' files untouched. SIGTERM unwinds a rank like Ctrl-C and
leaves it `interrupted`, and so does the death of the launcher that started it (`LauncherWatch`).
A rank that fails after another rank ended first says so: its failure is the other's consequence.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import torch

from profiler import store
from profiler.capture import live_metrics
from profiler.capture.progress import Progress
from profiler.config import RunConfig
from profiler.instruments.base import Instrument
from profiler.instruments.comm import CommStats
from profiler.instruments.compile_watch import CompileWatch
from profiler.instruments.prometheus import MetricsServer, MetricsTap
from profiler.instruments.samplers import Sampler, choose_backend
from profiler.instruments.step_timer import StepTimer
from profiler.instruments.torch_profiler import TraceWindow
from profiler.settings import ProfileConfig
from reference_model.context import setup_context
from reference_model.hooks import TrainerHook
from reference_model.trainer import Trainer


class Interrupted(KeyboardInterrupt):
    """A signal (SIGTERM), raised in the main thread so the run unwinds like Ctrl-C and is marked `interrupted`."""

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame}")
        self.signame, self.at = signame, time.time()


def raise_interrupted(signum: int, frame: Any) -> None:
    """The SIGTERM handler of a run: the run unwinds as from Ctrl-C."""
    raise Interrupted(signal.Signals(signum).name)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Interrupted` in the main thread while inside: a run stopped by a CI timeout, `timeout`
    or systemd unwinds and keeps what it measured, as from Ctrl-C."""
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_ignored(*signums: signal.Signals) -> Iterator[None]:
    """Inside, these signals are ignored: a process already stopping finishes writing what it measured
    instead of dying halfway through it."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class LauncherWatch:
    """Interrupts this rank's main thread (as SIGTERM does) once the process that launched it is gone.

    A launcher killed outright (SIGKILL, the OOM killer) cannot stop torchrun or the ranks: without this they
    would train on to the end, into a run nobody finalizes.
    """

    INTERVAL_S = 0.5

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._process: psutil.Process | None = psutil.Process(pid)  # its start time guards against a reused pid
        except psutil.Error:
            self._process = None
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="glmperf-launcher-watch", daemon=True).start()

    @property
    def gone(self) -> bool:
        try:
            return (self._process is None or not self._process.is_running()
                    or self._process.status() == psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return True

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            if self.gone:
                _thread.interrupt_main(signal.SIGTERM)
                return


class _Events(TrainerHook):
    """Trainer events (NaN, spikes, checkpoints, batch-size changes) straight to events.jsonl."""

    def __init__(self, writer: store.RunWriter | MetricsTap) -> None:
        self.writer = writer

    def on_event(self, event: dict[str, Any]) -> None:
        self.writer.add_event(event)


def instruments(profile: ProfileConfig, writer: store.RunWriter | MetricsTap, *, device: torch.device, rank: int,
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
    """A rank's status from how its training ended, and the fields that say why (`error` in one line)."""
    if error is None:
        return "completed", {}
    if isinstance(error, KeyboardInterrupt):
        return "interrupted", {"error": str(error) or "KeyboardInterrupt"}
    first_line = next((line for line in str(error).splitlines() if line.strip()), "")
    return "failed", {"error": f"{type(error).__name__}: {first_line}".rstrip(": "),
                      "traceback": "".join(traceback.format_exception(error))}


class RankRecord:
    """One rank's part of a run: its writer, its hooks, and its status record (parts/status-r<rank>.json).

    The status says `running` (with this process's pid and host) from the start, so a reader of a
    live or killed run knows the ranks; `close` rewrites it with the outcome, after closing the
    instruments (their summaries go into the record) and flushing every buffered row. With several
    ranks the outcome names its cause first: this rank's signal, its launcher's death, or the rank that
    ended before this one failed (a peer's end breaks the others' collectives: that is not their failure).
    """

    def __init__(self, run_dir: Path, *, rank: int, flush_interval_s: float, world_size: int = 1,
                 launcher: LauncherWatch | None = None) -> None:
        self.run_dir, self.rank, self.world_size, self.launcher = run_dir, rank, world_size, launcher
        self.writer = store.RunWriter(run_dir, rank=rank, flush_interval_s=flush_interval_s)
        self.sink: Any = self.writer
        """Where the instruments write: the writer, seen by the live metrics when they are served."""
        self.metrics: MetricsServer | None = None
        self.fields: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname()}
        self.hooks: list[TrainerHook] = []
        store.write_rank_status(run_dir, rank, "running", **self.fields)

    def serve_metrics(self, profile: ProfileConfig, device: torch.device) -> None:
        """Serve this rank's live metrics until it ends, when the run asks for them."""
        self.metrics = live_metrics.serve(self.run_dir, profile, rank=self.rank, world_size=self.world_size,
                                          device=device)
        if self.metrics is not None:
            self.sink = MetricsTap(self.writer, self.metrics.figures)

    def update(self, **fields: Any) -> None:
        self.fields.update(fields)
        if self.metrics is not None and (flops := live_metrics.model_flops(fields)) is not None:
            self.metrics.figures.flops_per_token = flops
        store.write_rank_status(self.run_dir, self.rank, "running", **self.fields)

    def outcome(self, error: BaseException | None) -> tuple[str, dict[str, Any]]:
        """This rank's status and why, its cause first."""
        status, why = rank_outcome(error)
        if error is not None and self.launcher is not None and self.launcher.gone:
            return "interrupted", {**why, "error": f"its launcher (pid {self.launcher.pid}) died; the ranks stopped "
                                                  "with it"}
        stop = error if isinstance(error, Interrupted) else None
        if self.world_size == 1 or not (stop or status == "failed"):
            return status, why
        peer = self._first_ended_peer(before=stop.at if stop else time.time())
        if peer is None:
            return status, {**why, "error": f"rank {self.rank} was stopped by {stop.signame}"} if stop else why
        cause = peer["error"] if peer["status"] == "interrupted" else f"rank {peer['rank']} failed ({peer['error']})"
        then = "was then stopped with it" if stop else "then lost its connection to it"
        return "interrupted", {**why, "error": f"{cause}; rank {self.rank} {then}"}

    def _first_ended_peer(self, before: float) -> dict[str, Any] | None:
        """The other rank that ended first, stopped or failed, if it ended `before` (when this rank's signal
        came: torchrun stops the others once one ended). A peer writes its outcome before its connections
        close, so one whose end broke this rank's collectives has written it by now."""
        ended = []
        for s in store.read_rank_statuses(self.run_dir):
            if s["rank"] != self.rank and s.get("status") in ("interrupted", "failed"):
                at = store.rank_status_path(self.run_dir, s["rank"]).stat().st_mtime
                if at < before:
                    ended.append((at, s))
        return min(ended, key=lambda e: e[0])[1] if ended else None

    def close(self, error: BaseException | None) -> str:
        """Close the instruments and the writer, write the outcome; returns the rank's status.

        SIGTERM is ignored meanwhile: a rank asked to stop while it writes its outcome is stopping already."""
        with signals_ignored(signal.SIGTERM):
            if self.launcher is not None:
                self.launcher.close()
            if self.metrics is not None:  # a rank that ended serves nothing
                self.metrics.close()
            status, why = self.outcome(error)
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
             progress: bool = True, extra_hooks: Sequence[TrainerHook] = (), launcher: int | None = None) -> None:
    """Train this rank with its instruments; its outcome goes to its status record (RankRecord).

    `launcher`: the pid of the process that launched this rank on this host, when it is another process:
    the rank stops when it dies (LauncherWatch)."""
    watch = LauncherWatch(launcher) if launcher is not None and launcher != os.getpid() else None
    record = RankRecord(run_dir, rank=rank, flush_interval_s=cfg.profile.flush_interval_s, world_size=world_size,
                        launcher=watch)
    error: BaseException | None = None
    try:
        with sigterm_as_interrupt():
            record.serve_metrics(cfg.profile, device)
            comm = CommStats(device) if world_size > 1 and cfg.profile.instruments else None
            ctx = setup_context(cfg.train, cfg.data, device=device, rank=rank, world_size=world_size,
                                memory_budget_bytes=cfg.memory_budget_bytes,
                                wrap_comm_hook=comm.wrap if comm is not None else None)
            if cfg.profile.instruments:
                record.hooks, record.fields["sampling"] = instruments(
                    cfg.profile, record.sink, device=device, rank=rank, comm=comm,
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
