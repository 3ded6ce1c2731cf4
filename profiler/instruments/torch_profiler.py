"""TraceWindow: torch.profiler over a bounded window of steps -> a chrome trace and an operator table.

The profiler runs with a `wait / warmup / active` schedule and `repeat=1` (Lightning's default
window is 1/1/3; tracing every step costs up to 77% per step and GBs of trace, anchors.md 13).
While the window collects, every trainer phase is wrapped in `record_function("glmperf/<phase>")`
and every step in `glmperf/step#N`, so the trace shows our phases above the operators.

The slow part, exporting the trace and aggregating operators (1-2.5 s on the tiny model), is
NOT done inside the measured steps: when the window closes, between two steps, the trace is exported
(gzip) to `writer.trace_path(rank)` and the operator table written, timed as
`summary()["trace_processing_s"]`, and the profiler is let go. Kept to the end of training, its results
(hundreds of MB with shapes and memory) spread over the heap, and the steps after the window page-faulted
into fresh memory: 8.6% slower than the bare loop on `small` (benchmarks/own_loop_overhead), against
1.3% once it is let go. A window that training cuts short is exported at `on_train_end` (which also
runs when training fails).

Attach it after StepTimer: the profiler's own state changes (starting and stopping the trace, in
`prof.step()` at a step's end) then fall between steps instead of inside a timed one.

`is_active(step)` is True for the steps during which the profiler was collecting (its warmup and
active steps: both carry profiler overhead), and, with several ranks, for the step after the window,
whose first collective waits for every rank's export; StepTimer stores it as the `profiled` column.

ops.parquet columns (`key_averages(group_by_input_shape=True)` over the active steps): `rank`,
`name`, `input_shapes` (str), `calls`, `self_cpu_s`, `cpu_total_s`, `self_device_s`,
`device_total_s` (s), `self_cpu_memory_bytes`, `self_device_memory_bytes` (bytes allocated minus
freed by the op itself), `flops` (estimated for matmul/conv, 0 for other ops), `steps` (active
steps the numbers cover: divide by it for per-step figures). Our `glmperf/*` ranges and the
profiler's `ProfilerStep#N` appear as rows too.

With `memory_snapshot=True` on CUDA, the caching allocator's history is recorded from train start
(`torch.cuda.memory._record_memory_history`, a ring buffer of `snapshot_max_entries` events, python
stacks only: the default "all" stacks are slow, torchtitan PR 2991) and dumped at train end, also
after an OOM, to traces/memory_snapshot_rank<r>.pickle for pytorch.org/memory_viz.

The window prints nothing of its own: kineto's `USDT ... profiler_start/stop` lines are silenced by
KINETO_LOG_LEVEL (unless the user set it), and torch's "Memory block of unknown size" line, which C++
logs to stderr where no warning filter reaches, is dropped by `StderrFilter` while the window collects.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerAction, ProfilerActivity, profile, record_function, schedule

from profiler.instruments.base import Instrument
from reference_model.hooks import TrainStart

log = logging.getLogger("glmperf.trace")

_COLLECTING = (ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
KINETO_QUIET = "6"
"""KINETO_LOG_LEVEL above kineto's highest level (USDT, 5): its profiler_start/stop lines tell a user nothing
to act on, and a failed trace is the window's `trace_error` anyway."""
UNKNOWN_BLOCK = re.compile(rb"\] Memory block of unknown size was allocated before the profiling started, profiler "
                           rb"results will not include the deallocation event")
"""What c10 logs when memory allocated before profiling is freed while it records memory: nothing to act on."""


class StderrFilter:
    """The process's stderr (fd 2) through a pipe whose reader drops the lines matching `pattern` and passes
    every other byte on: for what C++ prints, which Python's warning filters never see.

    Children started meanwhile inherit the pipe; the reader serves them until they close it, and drains
    the pipe even when stderr itself fails, so no writer ever blocks on it.
    """

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        sys.stderr.flush()
        self._saved, out = os.dup(2), os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._reader = threading.Thread(target=self._pump, args=(read, out), name="glmperf-stderr-filter",
                                        daemon=True)
        self._reader.start()

    def close(self) -> None:
        """Give fd 2 back; what the pipe still holds is passed on (within a second, unless a child keeps it)."""
        if self._saved < 0:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._saved = -1
        self._reader.join(timeout=1.0)

    def _pump(self, read: int, out: int) -> None:
        pending = b""
        while chunk := os.read(read, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            _write_all(out, b"".join(line + b"\n" for line in lines if not self.pattern.search(line)))
        if not self.pattern.search(pending):
            _write_all(out, pending)
        os.close(read)
        os.close(out)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # stderr gone: what it would have shown is lost either way
        while data:
            data = data[os.write(fd, data):]


class TraceWindow(Instrument):
    """Profiles steps `wait+warmup .. wait+warmup+active-1` (counted from this process's first step)."""

    def __init__(self, writer: Any, *, device: torch.device | str | None = None, rank: int | None = None,
                 wait: int = 2, warmup: int = 1, active: int = 3, memory_snapshot: bool = False,
                 snapshot_max_entries: int = 100_000) -> None:
        if active < 1 or wait < 0 or warmup < 0:
            raise ValueError(f"trace window needs wait >= 0, warmup >= 0, active >= 1; "
                             f"got {wait}/{warmup}/{active}")
        self.writer, self.rank = writer, rank
        self.device = torch.device(device) if device is not None else None
        self.wait, self.warmup, self.active = wait, warmup, active
        self.memory_snapshot = memory_snapshot
        self.snapshot_max_entries = snapshot_max_entries
        self.collected: set[int] = set()
        self.recorded: list[int] = []
        self._prof: profile | None = None
        self._ready = False
        self._ranges: dict[str, Any] = {}
        self._snapshotting = False
        self._done = False
        self._settling = False
        self._quiet: StderrFilter | None = None
        self._summary: dict[str, Any] = {"trace_path": None, "trace_processing_s": 0.0, "ops_rows": 0}

    def is_active(self, step: int) -> bool:
        """Whether the profiler was collecting (warmup or active) during `step`."""
        return step in self.collected

    # -- hooks ------------------------------------------------------------------------------
    def on_train_start(self, start: TrainStart) -> None:
        if self.rank is None:
            self.rank = start.rank
        device = self.device or start.device
        cuda = device.type == "cuda" and torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self._prof = profile(
            activities=activities, record_shapes=True, profile_memory=True, with_stack=False, with_flops=True,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._keep)
        if cuda and self.memory_snapshot:
            torch.cuda.memory._record_memory_history(max_entries=self.snapshot_max_entries, stacks="python")
            self._snapshotting = True
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)  # read when kineto starts, the first time
        self._quiet = StderrFilter(UNKNOWN_BLOCK)
        self._prof.start()

    def on_step_start(self, step: int) -> None:
        if self._settling:  # the first step after the window: see `is_active`
            self._settling = False
            self.collected.add(step)
        action = self._action()
        if action in _COLLECTING:
            self.collected.add(step)
            if action in _RECORDING:
                self.recorded.append(step)
            self._open(f"glmperf/step#{step}")

    def on_phase_start(self, step: int, phase: str) -> None:
        if step in self.collected:
            self._open(f"glmperf/{phase}")

    def on_phase_end(self, step: int, phase: str) -> None:
        self._close(f"glmperf/{phase}")

    def on_step_end(self, record: Any) -> None:
        self._close(f"glmperf/step#{record.step}")
        if self._prof is not None and not self._ready:
            self._prof.step()

    def on_train_end(self, result: Any, error: BaseException | None) -> None:
        self._finish()

    def close(self) -> None:
        self._finish()

    def summary(self) -> dict[str, Any]:
        return {"window": [self.wait, self.warmup, self.active], "profiled_steps": sorted(self.collected),
                "recorded_steps": list(self.recorded), **self._summary}

    # -- internals --------------------------------------------------------------------------
    def _action(self) -> ProfilerAction | None:
        if self._prof is None or self._ready:
            return None
        return self._prof.current_action

    def _keep(self, prof: profile) -> None:
        """on_trace_ready (between two steps, or when training ends): export the window now and let go of
        the profiler, whose results, kept to the end, spread over the heap so later steps page-fault."""
        self._ready = True
        self._unquiet()
        t0 = time.perf_counter()
        try:
            self._export(prof)
        except Exception as exc:  # a failed export must not hide how training went
            self._failed(exc)
        self._summary["trace_processing_s"] = time.perf_counter() - t0
        self._prof = None  # the caller, prof.step() or stop(), holds it until it returns
        self._settling = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _failed(self, exc: Exception) -> None:
        log.warning("trace processing failed: %s", exc)
        self._summary["trace_error"] = f"{type(exc).__name__}: {exc}"

    def _unquiet(self) -> None:
        if self._quiet is not None:
            self._quiet.close()
            self._quiet = None

    def _open(self, name: str) -> None:
        ctx = record_function(name)
        ctx.__enter__()
        self._ranges[name] = ctx

    def _close(self, name: str) -> None:
        ctx = self._ranges.pop(name, None)
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def _finish(self) -> None:
        """Stop the profiler if the window is still open (a window cut short by the end of training is
        still exported, by `_keep`), once."""
        if self._done:
            return
        self._done = True
        for name in list(self._ranges):
            self._close(name)
        if self._prof is not None:
            try:
                self._prof.stop()
            except Exception as exc:  # a failed stop must not hide how training went
                self._failed(exc)
            self._prof = None
            if not self._ready and "trace_error" not in self._summary:
                self._summary["trace_error"] = "training ended before the window's active steps"
        self._unquiet()
        if self._snapshotting:
            self._dump_snapshot()

    def _export(self, prof: profile) -> None:
        path = self.writer.trace_path(self.rank or 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))  # gzip when the path ends in .gz
        self._summary["trace_path"] = str(path)
        rows = [self._op_row(evt) for evt in prof.key_averages(group_by_input_shape=True)]
        if rows:
            self.writer.add_ops(rows)
        self._summary["ops_rows"] = len(rows)

    def _op_row(self, evt: Any) -> dict[str, Any]:
        return {
            "rank": self.rank or 0, "name": evt.key, "input_shapes": str(evt.input_shapes or ""),
            "calls": int(evt.count), "self_cpu_s": evt.self_cpu_time_total / 1e6,
            "cpu_total_s": evt.cpu_time_total / 1e6, "self_device_s": evt.self_device_time_total / 1e6,
            "device_total_s": evt.device_time_total / 1e6,
            "self_cpu_memory_bytes": int(evt.self_cpu_memory_usage),
            "self_device_memory_bytes": int(evt.self_device_memory_usage),
            "flops": int(evt.flops or 0), "steps": len(self.recorded),
        }

    def _dump_snapshot(self) -> None:
        path = self.writer.trace_path(self.rank or 0).parent / f"memory_snapshot_rank{self.rank or 0}.pickle"
        t0 = time.perf_counter()
        try:
            torch.cuda.memory._dump_snapshot(str(path))
            self._summary["memory_snapshot_path"] = str(path)
        except Exception as exc:
            log.warning("memory snapshot failed: %s", exc)
            self._summary["memory_snapshot_error"] = f"{type(exc).__name__}: {exc}"
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._snapshotting = False
        self._summary["memory_snapshot_s"] = time.perf_counter() - t0
