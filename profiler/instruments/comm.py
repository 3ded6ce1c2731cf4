"""Communication counters: every DDP gradient all-reduce of a step, counted and timed.

`CommStats.wrap(torch_hook, wire_dtype)` is what the profiler hands the ddp switch as
`SetupContext.wrap_comm_hook`: DDP registers the returned hook, which runs torch's own (allreduce,
fp16/bf16 compression, PowerSGD) and records each bucket's launch, completion and payload. The
profiler takes one step's figures with `take_step()` once per optimizer step.

Bytes are the payload each all-reduce is handed: the bucket's elements x 4 (fp32), x 2 (fp16,
bf16); for PowerSGD the elements after compression that `PowerSGDState.compression_stats()`
counts for the bucket (the P and Q factors plus the tensors it leaves uncompressed: biases,
norms, matrices too small to gain), or the whole bucket in its first plain all-reduce steps. A
ring all-reduce puts 2(N-1)/N times the payload on each rank's wire (the bus-bandwidth factor).

Exposed communication is approximated as the latest completion of any bucket minus the latest
launch: DDP launches the last bucket when backward has produced its last gradient, so no backward
compute is left to hide what runs after that. It includes the hook's own work on that bucket
(casts, PowerSGD's matmuls), which nothing overlaps either.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook


@dataclass
class _Bucket:
    calls: int
    nbytes: int
    launch: Any
    """Host seconds (perf_counter) or, on CUDA, an event recorded at launch."""
    done: Any = None


def _busy_time(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [launch, done] spans: time with at least one all-reduce in flight."""
    total, end = 0.0, -math.inf
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


class StepComm(Mapping[str, float]):
    """One step's all-reduce figures, computed when first read.

    calls: collectives issued (1 per bucket; PowerSGD 3: uncompressed tensors, P, Q);
    buckets: DDP buckets reduced; bytes: payload handed to all_reduce (module docstring);
    time_s: wall time with at least one bucket in flight, launch to completion, hook work included;
    exposed_s: the part after the last launch, which backward does not overlap;
    bandwidth: bytes / time_s in bytes/s (algorithm bandwidth).

    On CUDA the spans are events: reading before the step's device work is done waits for it, so a
    caller that reads lazily (after its own end-of-step event) never stalls the host.
    """

    def __init__(self, buckets: list[_Bucket], *, cuda: bool) -> None:
        self._buckets, self._cuda = buckets, cuda
        self._values: dict[str, float] | None = None

    def _spans(self, buckets: list[_Bucket]) -> list[tuple[float, float]]:
        if not self._cuda:
            return [(b.launch, b.done) for b in buckets]
        for b in buckets:
            b.launch.synchronize()
            b.done.synchronize()
        origin = buckets[0].launch
        return [(origin.elapsed_time(b.launch) / 1e3, origin.elapsed_time(b.done) / 1e3) for b in buckets]

    def _resolve(self) -> dict[str, float]:
        if self._values is None:
            finished = [b for b in self._buckets if b.done is not None]
            spans = self._spans(finished) if finished else []
            busy = _busy_time(spans)
            exposed = max(0.0, max(d for _, d in spans) - max(s for s, _ in spans)) if spans else 0.0
            nbytes = sum(b.nbytes for b in self._buckets)
            self._values = {"calls": sum(b.calls for b in self._buckets), "buckets": len(self._buckets),
                            "bytes": nbytes, "time_s": busy, "exposed_s": exposed,
                            "bandwidth": nbytes / busy if busy > 0 else 0.0}
            self._buckets = []
        return self._values

    def __getitem__(self, key: str) -> float:
        return self._resolve()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._resolve())

    def __len__(self) -> int:
        return len(self._resolve())


class CommStats:
    """The gradient all-reduces of the current step, filled by the hooks `wrap` returns.

    `take_step()` hands over the buckets launched since its last call and starts over; the
    profiler calls it once per optimizer step. Times come from the host clock on CPU (a gloo
    future completes when its all-reduce has) and from CUDA events on GPU (an NCCL future
    completes at launch, but an event recorded in its callback completes with the collective).
    """

    MAX_PENDING = 10_000
    """Buckets kept when nobody takes them (a run that never calls take_step must not grow)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._lock = threading.Lock()
        self._pending: deque[_Bucket] = deque(maxlen=self.MAX_PENDING)

    def clock(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def launched(self, *, calls: int, nbytes: int, at: Any) -> _Bucket:
        bucket = _Bucket(calls=calls, nbytes=nbytes, launch=at)
        with self._lock:
            self._pending.append(bucket)
        return bucket

    def completed(self, bucket: _Bucket) -> None:
        bucket.done = self.clock()

    def take_step(self) -> StepComm:
        """This step's all-reduces (see `StepComm` for the keys and units); the next step starts empty."""
        with self._lock:
            buckets = list(self._pending)
            self._pending.clear()
        return StepComm(buckets, cuda=self.cuda)

    def wrap(self, torch_hook: Callable, wire_dtype: torch.dtype | None) -> Callable:
        """`torch_hook` (one of torch's DDP comm hooks) recording each bucket's all-reduce here.

        wire_dtype: the dtype the hook casts a bucket to (fp16/bf16 hooks); None: the bucket's own.
        """

        # No annotations: DDP compares them with dist.GradBucket / Future[Tensor] by identity.
        def recorded(state, bucket):
            buffer = bucket.buffer()
            launch = self.clock()
            if isinstance(state, powerSGD_hook.PowerSGDState) and state.iter >= state.start_powerSGD_iter:
                before = state.compression_stats()[2]
                future = torch_hook(state, bucket)  # counts this bucket's compressed elements synchronously
                numel, calls = state.compression_stats()[2] - before, 3
            else:
                future = torch_hook(state, bucket)
                numel, calls = buffer.numel(), 1
            itemsize = (wire_dtype or buffer.dtype).itemsize
            record = self.launched(calls=calls, nbytes=numel * itemsize, at=launch)

            def done(fut: torch.futures.Future) -> torch.Tensor:
                self.completed(record)
                return fut.value()

            return future.then(done)

        # Its own name, never torch's: DDP checks some hooks by name (see optimizers.ddp).
        recorded.__name__ = recorded.__qualname__ = f"recorded_{torch_hook.__name__}"
        return recorded
