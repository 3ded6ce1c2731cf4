"""StepTimer: one row per optimizer step and rank, the core measurement of a run (steps.parquet).

How it measures. On CPU every phase is timed with `time.perf_counter` between the trainer's
`on_phase_start`/`on_phase_end` calls. On CUDA the same boundaries record `torch.cuda.Event`
pairs on the device's current stream, and the step is read LAZILY: its events stay pending until
`event.query()` says the device has passed them (checked at later step ends, waited for at train
end), so timing never synchronizes the device. Loss and grad norm are copied to the host with a
non-blocking copy enqueued before the step's end event, and read once that event is done. CUDA
times are on the device's timeline: a phase the host spends waiting (data) while queued kernels
keep the device busy shows up as ~0 there, i.e. every phase time is its *exposed* time.

Columns, one row per step and rank (units in the names; copied to docs/run-format.md):

- `step`: optimizer step index (0-based; continues after a resume). `rank`: torch.distributed rank.
- `ts_end` (unix s): host wall clock when the step ended.
- `step_s` (s): the step from start to end. CPU: host wall time. CUDA: the device-timeline span
  between the step's start and end events, device idle inside the step included.
- `host_s` (s): host wall time from step start to step end (equal to `step_s` on CPU; on CUDA the
  host may run ahead of the device or lag it).
- `data_s` (s): waiting for the next batch from the loader, summed over micro-batches.
- `h2d_s` (s): host-to-device copy of the batch.
- `forward_s` (s): forward pass including the loss.
- `backward_s` (s): backward pass, minus `comm_s`.
- `optimizer_s` (s): unscale, clip / grad norm, optimizer and scheduler step.
- `comm_s` (s): exposed (not overlapped) communication, the DDP comm counters' `exposed_s`. It is
  carved out of backward, where DDP blocks waiting for its last all-reduce, and capped at it.
- `checkpoint_s` (s): checkpoint save after the step (0 on other steps).
- `other_s` (s): `step_s` minus the sum of the phases above, >= 0 (hooks, loop overhead, gaps, and
  any phase outside the vocabulary). The phase columns sum to `step_s`.
- `tokens`: input tokens this rank processed. `batch_size` (samples): the micro-batch size.
  `micro_batches`: micro-batches accumulated into the step.
- `loss`: mean loss over the micro-batches. `grad_norm`: global gradient L2 norm before clipping.
  Both are read when the device has produced them (a non-blocking copy), never by a device sync.
  `lr`: learning rate the step used. `loss_scale`: GradScaler scale after the step (NaN without).
- `skipped` (bool): the update was skipped (NaN guard, fp16 overflow).
- `warmup` (bool): the step includes one-off work (torch.compile); summaries exclude it.
- `profiled` (bool): the torch.profiler window was collecting (its warmup or active steps), or, with
  several ranks, it is the step after the window (its collectives wait for every rank's export), so the
  step carries profiler overhead.
- `mem_alloc_peak_bytes`, `mem_reserved_peak_bytes` (bytes): CUDA `max_memory_allocated` /
  `max_memory_reserved` over the step (peak stats are reset after each step); NaN on CPU.
- `rss_bytes` (bytes): process resident set size at step end (psutil).
- `rss_peak_bytes` (bytes): the process's RSS high-water mark (VmHWM, read as getrusage's ru_maxrss). Per
  step where Linux lets the process reset it (writing "5" to /proc/self/clear_refs, allowed for
  the owner); otherwise since process start. `summary()["rss_peak_scope"]` says which; NaN off Linux.
- `comm_calls`, `comm_bytes` (bytes), `comm_time_s` (s): the step's collectives, from the DDP comm
  counters: how many, how many bytes, and their total time, overlapped or not. 0 in a single
  process; NaN with several ranks but no counters (not measured).
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil
import torch

from profiler.instruments.base import Instrument
from profiler.metrics import DERIVED_PHASES, PHASE_COLUMNS, PHASES
from reference_model.hooks import StepRecord, TrainStart

STEP_COLUMNS = (
    "step", "rank", "ts_end", "step_s", "host_s", *PHASE_COLUMNS,
    "tokens", "batch_size", "micro_batches", "loss", "grad_norm", "lr", "loss_scale",
    "skipped", "warmup", "profiled",
    "mem_alloc_peak_bytes", "mem_reserved_peak_bytes", "rss_bytes", "rss_peak_bytes",
    "comm_calls", "comm_bytes", "comm_time_s",
)
"""steps.parquet columns, in order (documented in the module docstring)."""
_TIMED = tuple(p.name for p in PHASES if p.name not in DERIVED_PHASES)

NAN = float("nan")
_STATM = Path("/proc/self/statm")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _RssReader:
    """(RSS, RSS high-water mark) in bytes: /proc/self/statm (kept open, one pread) and
    getrusage's ru_maxrss, which is the VmHWM that clear_refs resets. Reading /proc/self/status
    instead cost ~56 us a step inside a training loop (a few us in isolation); these cost ~2 us.
    `read()` is None off Linux."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(_STATM, os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[float, float] | None:
        if self._fd is None:
            return None
        try:
            resident = int(os.pread(self._fd, 128, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return None
        return float(resident * _PAGE), float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _HwmReset:
    """Resets VmHWM to the current RSS (Linux >= 4.0, process owner) through one open file."""

    def __init__(self) -> None:
        try:
            self._file: TextIO | None = open(_CLEAR_REFS, "w")  # noqa: SIM115 - kept open: one write per step
            self.reset()
        except OSError:
            self._file = None

    @property
    def works(self) -> bool:
        return self._file is not None

    def reset(self) -> None:
        if self._file is not None:
            self._file.write("5")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class _Pending:
    """A CUDA step whose events and values the device has not necessarily reached yet."""

    record: StepRecord
    ts_end: float
    host_s: float
    start: torch.cuda.Event
    end: torch.cuda.Event
    phases: list[tuple[str, torch.cuda.Event, torch.cuda.Event]]
    memory: tuple[float, float, float, float]
    comm: dict[str, Any] | None


class StepTimer(Instrument):
    """Times every phase of every step and writes one row per step (see the module docstring).

    `device` and `rank` default to what `on_train_start` says. `comm` is the run's communication
    counters (profiler.instruments.comm.CommStats; None in a single process). `profiled(step)` tells
    whether the torch.profiler window was collecting during a step (pass `TraceWindow.is_active`,
    or assign it to the attribute later). `current_step` is the step in progress, read by the
    sampler to tag its samples (-1 before the first step). Attach it as the first hook, so the
    step it times is the trainer's, not other instruments' per-step work.
    """

    def __init__(self, writer: Any, *, device: torch.device | str | None = None, rank: int | None = None,
                 comm: Any = None, profiled: Callable[[int], bool] | None = None) -> None:
        self.writer = writer
        self.profiled = profiled or (lambda step: False)
        self.current_step = -1
        self.device = torch.device(device) if device is not None else None
        self.rank = rank
        self.world_size = 1
        self.comm_stats: Any = comm
        self.cuda: torch.device | None = None
        self._process = psutil.Process()
        self._hwm: _HwmReset | None = None
        self._rss: _RssReader | None = None
        self._at_start = NAN
        """Memory held when training starts (model and optimizer built): what no step-level switch frees."""
        self._rows = 0
        self._unresolved = 0
        # the step in progress
        self._t0 = 0.0
        self._open: dict[str, float | torch.cuda.Event] = {}
        self._phase_s: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._start_event: torch.cuda.Event | None = None
        self._pending: deque[_Pending] = deque()

    # -- hooks ------------------------------------------------------------------------------
    def on_train_start(self, start: TrainStart) -> None:
        if self.rank is None:
            self.rank = start.rank
        self.world_size = start.world_size
        device = self.device or start.device
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            self.cuda = torch.device("cuda", index)
            torch.cuda.reset_peak_memory_stats(self.cuda)
        self._hwm = _HwmReset()
        self._rss = _RssReader()
        rss = self._rss.read()
        self._at_start = float(torch.cuda.memory_allocated(self.cuda)) if self.cuda is not None else \
            rss[0] if rss is not None else NAN

    def on_step_start(self, step: int) -> None:
        self.current_step = step
        self._phase_s = defaultdict(float)
        self._events = []
        self._open = {}
        self._t0 = time.perf_counter()
        self._start_event = self._record() if self.cuda is not None else None

    def on_phase_start(self, step: int, phase: str) -> None:
        self._open[phase] = self._record() if self.cuda is not None else time.perf_counter()

    def on_phase_end(self, step: int, phase: str) -> None:
        start = self._open.pop(phase, None)
        if start is None:
            return
        if isinstance(start, float):  # a CPU step: perf_counter's time
            self._phase_s[phase] += time.perf_counter() - start
        else:
            self._events.append((phase, start, self._record()))

    def on_step_end(self, record: StepRecord) -> None:
        comm = self.comm_stats.take_step() if self.comm_stats is not None else None
        if self.cuda is None:
            t1 = time.perf_counter()
            host_s = t1 - self._t0
            row = self._row(record, time.time(), host_s, host_s, dict(self._phase_s), self._memory(), comm)
            self._emit([row])
            return
        assert self._start_event is not None, "on_step_start records it on CUDA"
        record.scalars()  # enqueue the copy of loss and grad norm before the step's end event
        end = self._record()
        self._pending.append(_Pending(record, time.time(), time.perf_counter() - self._t0, self._start_event,
                                      end, self._events, self._memory(), comm))
        self._emit(list(self._resolve(wait=False)))

    def on_train_end(self, result: Any, error: BaseException | None) -> None:
        self.close()

    def flush(self) -> None:
        """Wait for the steps still pending on the device and write them, and go on timing (a probe
        reads every step's row before it drives the next trainer)."""
        self._emit(list(self._resolve(wait=True)))

    def close(self) -> None:
        """Wait for the steps still pending on the device and write them (train end only)."""
        rows: list[dict[str, Any]] = []
        try:
            rows.extend(self._resolve(wait=True))
        except RuntimeError:  # a broken device (e.g. after a device-side assert): keep what we have
            self._unresolved += len(self._pending)
            self._pending.clear()
        self._emit(rows)
        if self._hwm is not None:
            self._hwm.close()
        if self._rss is not None:
            self._rss.close()

    def summary(self) -> dict[str, Any]:
        return {"steps_written": self._rows, "unresolved_steps": self._unresolved,
                "timing": "cuda_events" if self.cuda is not None else "perf_counter",
                "rss_peak_scope": "step" if self._hwm is not None and self._hwm.works else "process",
                "memory_at_start_bytes": self._at_start}

    # -- internals --------------------------------------------------------------------------
    def _record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.cuda))
        return event

    def _memory(self) -> tuple[float, float, float, float]:
        """(allocated peak, reserved peak, RSS, RSS peak) of the step just ended; resets the peaks."""
        alloc = reserved = NAN
        if self.cuda is not None:  # allocator bookkeeping lives on the host: no device sync here
            alloc = float(torch.cuda.max_memory_allocated(self.cuda))
            reserved = float(torch.cuda.max_memory_reserved(self.cuda))
            torch.cuda.reset_peak_memory_stats(self.cuda)
        read = self._rss.read() if self._rss is not None else None
        rss, peak = read if read is not None else (float(self._process.memory_info().rss), NAN)
        if self._hwm is not None and self._hwm.works:
            try:
                self._hwm.reset()
            except OSError:
                self._hwm.close()
        return alloc, reserved, rss, peak

    def _resolve(self, *, wait: bool) -> Iterator[dict[str, Any]]:
        """Rows of the pending CUDA steps the device has finished (all of them if `wait`), oldest first."""
        while self._pending and (wait or self._pending[0].end.query()):
            p = self._pending[0]
            p.end.synchronize()  # returns at once unless `wait` (train end)
            self._pending.popleft()
            phase_s: dict[str, float] = defaultdict(float)
            for phase, start, end in p.phases:
                phase_s[phase] += start.elapsed_time(end) / 1000.0
            step_s = p.start.elapsed_time(p.end) / 1000.0
            yield self._row(p.record, p.ts_end, step_s, p.host_s, phase_s, p.memory, p.comm)

    def _row(self, record: StepRecord, ts_end: float, step_s: float, host_s: float, phase_s: dict[str, float],
             memory: tuple[float, float, float, float], comm: Any) -> dict[str, Any]:
        if comm is not None:
            calls, nbytes, time_s, exposed = (float(comm[k]) for k in ("calls", "bytes", "time_s",
                                                                        "exposed_s"))
        else:  # one process has nothing to communicate; several without counters is "not measured"
            calls = nbytes = time_s = exposed = 0.0 if self.world_size == 1 else NAN
        backward = phase_s.get("backward", 0.0)
        comm_s = min(exposed, backward) if not math.isnan(exposed) else 0.0
        phases = {f"{name}_s": phase_s.get(name, 0.0) for name in _TIMED}
        phases["backward_s"] = backward - comm_s
        phases["comm_s"] = comm_s
        phases["other_s"] = max(0.0, step_s - sum(phases.values()))
        loss, grad_norm = record.scalars().values()
        return {
            "step": record.step, "rank": self.rank, "ts_end": ts_end, "step_s": step_s, "host_s": host_s,
            **{c: phases[c] for c in PHASE_COLUMNS},
            "tokens": record.tokens, "batch_size": record.batch_size, "micro_batches": record.micro_batches,
            "loss": loss, "grad_norm": grad_norm, "lr": float(record.lr),
            "loss_scale": NAN if record.loss_scale is None else float(record.loss_scale),
            "skipped": bool(record.skipped), "warmup": bool(record.warmup),
            "profiled": bool(self.profiled(record.step)),
            "mem_alloc_peak_bytes": memory[0], "mem_reserved_peak_bytes": memory[1],
            "rss_bytes": memory[2], "rss_peak_bytes": memory[3],
            "comm_calls": calls, "comm_bytes": nbytes, "comm_time_s": time_s,
        }

    def _emit(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._rows += len(rows)
            self.writer.add_steps(rows)
