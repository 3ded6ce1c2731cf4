"""The communication counters: spans, bytes and the exposed tail of one step's all-reduces.

The end-to-end check (real DDP buckets over gloo, every comm hook's bytes) is in
tests/test_switch_ddp.py, whose torchrun worker registers `CommStats.wrap`.
"""

from __future__ import annotations

import pytest
import torch

from profiler.instruments.comm import CommStats


def test_union_of_spans_and_exposed_tail() -> None:
    stats = CommStats(torch.device("cpu"))
    for launch, done, nbytes in [(0.0, 0.5, 100), (0.2, 0.6, 100), (0.9, 1.0, 50)]:
        stats.completed(bucket := stats.launched(calls=1, nbytes=nbytes, at=launch))
        bucket.done = done
    step = stats.take_step()
    assert step["time_s"] == pytest.approx(0.7)  # [0, 0.6] and [0.9, 1.0]
    assert step["exposed_s"] == pytest.approx(0.1)  # last launch at 0.9, all done at 1.0
    assert (step["calls"], step["buckets"], step["bytes"]) == (3, 3, 250)
    assert step["bandwidth"] == pytest.approx(250 / 0.7)
    assert stats.take_step()["calls"] == 0


class _Bucket:
    """What a DDP hook sees of a gradient bucket: its flat buffer."""

    def __init__(self, numel: int) -> None:
        self._buffer = torch.ones(numel)

    def buffer(self) -> torch.Tensor:
        return self._buffer


def _allreduce_hook(state, bucket):  # torch's signature, no annotations (DDP compares them)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def test_wrap_records_each_bucket_in_the_wire_dtype_and_passes_the_result_through() -> None:
    stats = CommStats(torch.device("cpu"))
    fp32, fp16 = stats.wrap(_allreduce_hook, None), stats.wrap(_allreduce_hook, torch.float16)
    assert fp32.__name__ == "recorded__allreduce_hook"  # never torch's own name: DDP checks some by name
    out = fp32(None, _Bucket(10)).wait()
    fp16(None, _Bucket(6)).wait()
    assert torch.equal(out, torch.ones(10))
    step = stats.take_step()
    assert (step["calls"], step["buckets"], step["bytes"]) == (2, 2, 10 * 4 + 6 * 2)
    assert step["time_s"] >= 0 and step["exposed_s"] <= step["time_s"]
