"""The sampler: a daemon thread that reads a backend at a fixed rate for the whole run (samples.parquet).

Every row carries `ts` (unix s), `rank`, `step` (the step the host was in when the sample was
taken, from StepTimer.current_step; -1 before the first; on CUDA the host may run a step or two
ahead of the device) and `source` (the backend: "nvml",
"nvml_replay" or "cpu"), then the backend's own columns (nvml.py documents the NVML ones; the
CPU ones are below). The first sample is taken at train start and the last at train end, so even
a run shorter than the sampling period has two (W&B recorded nothing for runs under 15 s).

The sampler never fails the run: a read that raises is counted, its last error kept for
`summary()`, and the thread samples on. Rows go to `writer.add_samples` from the sampler thread,
so the writer must be thread-safe (profiler.store.RunWriter is); the training thread does no work
for the sampler.

CPU backend columns (psutil; rates over the interval since the previous sample; "workers" are
the process's children, recursively: DataLoader workers, compile workers):

- `device`: -1 (the host).
- `cpu_process_pct`, `cpu_workers_pct` (% of one core, can exceed 100): the training process's
  and its workers' CPU time per wall time.
- `cpu_system_pct` (% of all cores): the whole machine.
- `rss_bytes`, `rss_workers_bytes` (bytes): resident memory of the process and the sum over its
  workers (pages they share, e.g. after fork, are counted in each).
- `mem_system_used_bytes`, `mem_system_available_bytes` (bytes): the machine's memory.
- `io_read_bytes_per_s`, `io_write_bytes_per_s` (bytes/s): storage I/O of process + workers (Linux
  `read_bytes`: what really came from the device; reads served by the page cache do not count).
- `io_read_chars_per_s` (bytes/s): bytes passed to read()-like calls, page cache included (Linux).
- `io_read_ops_per_s`, `io_write_ops_per_s` (1/s): read/write calls of process + workers.
- `workers`: live child processes.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import psutil
import torch

from profiler.instruments.base import Instrument
from profiler.instruments.nvml import NvmlBackend, cuda_index, nvml_status
from reference_model.hooks import TrainStart

log = logging.getLogger("glmperf.sampler")
NAN = float("nan")


class Backend(Protocol):
    """What the sampler reads: `read()` returns one row per device, without the common tags."""

    source: str

    def read(self) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


_RATES = ("cpu_s", "read_bytes", "write_bytes", "read_ops", "write_ops", "read_chars")
"""Cumulative per-process counters the CPU backend turns into rates."""


class CpuBackend:
    """CPU, memory and I/O of this process, its workers and the machine, via psutil."""

    source = "cpu"

    CHILDREN_EVERY_S = 1.0
    """Listing the process tree scans all of /proc (~1.3 ms here, the bulk of a read): once a
    second is enough to see loader workers come and go."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self._children: list[psutil.Process] = []
        self._children_at = -math.inf
        psutil.cpu_percent(None)  # the first call only sets the baseline
        self._t_prev = time.monotonic()
        self._prev, _ = self._snapshot()

    def read(self) -> list[dict[str, Any]]:
        counters, rss = self._snapshot()
        now = time.monotonic()
        dt = max(now - self._t_prev, 1e-9)
        self._t_prev = now
        # A worker born since the last sample has all its counters inside this interval; one that
        # exited since loses its last increment (small).
        zero = dict.fromkeys(_RATES, 0.0)
        deltas = {pid: {k: cur[k] - self._prev.get(pid, zero)[k] for k in _RATES}
                  for pid, cur in counters.items()}
        self._prev = counters
        me = self.process.pid
        main = deltas.get(me, dict.fromkeys(_RATES, NAN))
        workers = [d for pid, d in deltas.items() if pid != me]

        def rate(key: str) -> float:
            return (main[key] + sum(w[key] for w in workers)) / dt

        vm = psutil.virtual_memory()
        return [{
            "device": -1,
            "cpu_process_pct": 100.0 * main["cpu_s"] / dt,
            "cpu_workers_pct": 100.0 * sum(w["cpu_s"] for w in workers) / dt,
            "cpu_system_pct": psutil.cpu_percent(None),
            "rss_bytes": rss.get(me, NAN),
            "rss_workers_bytes": float(sum(v for pid, v in rss.items() if pid != me)),
            "mem_system_used_bytes": float(vm.used),
            "mem_system_available_bytes": float(vm.available),
            "io_read_bytes_per_s": rate("read_bytes"),
            "io_write_bytes_per_s": rate("write_bytes"),
            "io_read_ops_per_s": rate("read_ops"),
            "io_write_ops_per_s": rate("write_ops"),
            "io_read_chars_per_s": rate("read_chars"),
            "workers": len(workers),
        }]

    def close(self) -> None: ...

    def _snapshot(self) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
        """Cumulative counters and RSS of the process and its live workers, by pid."""
        now = time.monotonic()
        if now - self._children_at >= self.CHILDREN_EVERY_S:
            try:
                self._children = self.process.children(recursive=True)
            except psutil.Error:
                self._children = []
            self._children_at = now
        procs = [self.process, *self._children]
        counters, rss = {}, {}
        for proc in procs:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss[proc.pid] = float(proc.memory_info().rss)
                    ios: tuple[float, ...]
                    try:
                        io = proc.io_counters()
                        ios = (io.read_bytes, io.write_bytes, io.read_count, io.write_count,
                               getattr(io, "read_chars", NAN))
                    except (psutil.AccessDenied, AttributeError):  # no /proc/<pid>/io, or not this OS
                        ios = (NAN,) * 5
            except psutil.Error:  # the worker exited between listing and reading
                rss.pop(proc.pid, None)
                continue
            counters[proc.pid] = dict(zip(_RATES, (times.user + times.system, *map(float, ios)), strict=True))
        return counters, rss


def choose_backend(device: torch.device | str) -> tuple[Backend, str]:
    """NVML when the run's device is CUDA and pynvml initializes, else the CPU backend; with why."""
    ok, why = nvml_status(device)
    if ok:
        index = cuda_index(device)
        try:
            backend = NvmlBackend([index])
        except Exception as exc:
            return CpuBackend(), f"NVML could not open cuda:{index}: {exc}"
        return backend, f"NVML on cuda:{index} ({backend.names[index]})"
    return CpuBackend(), why


class Sampler(Instrument):
    """Reads `backend` at `hz` on its own daemon thread from train start to train end (or `close()`).

    `current_step` returns the step in progress (pass `lambda: timer.current_step`); `rank`
    defaults to the one `on_train_start` gives; `reason` (why this backend) is repeated in `summary()`.
    """

    def __init__(self, writer: Any, backend: Backend, *, hz: float = 10.0, rank: int | None = None,
                 current_step: Callable[[], int] | None = None, reason: str = "") -> None:
        if hz <= 0:
            raise ValueError(f"hz must be > 0, got {hz}")
        self.writer, self.backend, self.hz, self.rank, self.reason = writer, backend, hz, rank, reason
        self.current_step = current_step or (lambda: -1)
        self.samples = self.rows = self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def on_train_start(self, start: TrainStart) -> None:
        if self.rank is None:
            self.rank = start.rank
        self.start()

    def on_train_end(self, result: Any, error: BaseException | None) -> None:
        self.close()

    def start(self) -> None:
        """Start sampling (also usable without a trainer, e.g. around a user's own loop)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"glmperf-sampler-r{self.rank or 0}",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        try:
            self.backend.close()
        except Exception as exc:  # never let a sampler fail the run, even on the way out
            log.warning("sampler backend close failed: %s", exc)

    def summary(self) -> dict[str, Any]:
        extra: dict[str, Any] = getattr(self.backend, "summary", dict)()
        return {"source": self.backend.source, "reason": self.reason, "hz": self.hz, "samples": self.samples,
                "rows": self.rows, "read_errors": self.errors, "last_error": self.last_error, **extra}

    def _loop(self) -> None:
        period = 1.0 / self.hz
        deadline = time.monotonic()
        while True:
            self._sample()
            deadline += period
            delay = deadline - time.monotonic()
            if delay < 0:  # fell behind (a slow read): skip the missed ticks rather than burst
                deadline, delay = time.monotonic(), 0.0
            if self._stop.wait(delay):
                break
        self._sample()

    def _sample(self) -> None:
        try:
            ts, step = time.time(), int(self.current_step())
            rows = [{"ts": ts, "rank": self.rank or 0, "step": step, "source": self.backend.source, **row}
                    for row in self.backend.read()]
            self.writer.add_samples(rows)
        except Exception as exc:
            self.errors += 1
            if self.last_error is None:
                log.warning("sampler read failed (sampling goes on; counted in the run summary): %s", exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        self.samples += 1
        self.rows += len(rows)
