"""One large trace read by several processes at once: its blocks parsed by worker processes and by the reading
process are the trace one process reads, column for column (the codes into the same tables, the exact
times, the collectives' args), and give the same figures; a block a worker cannot cut cleanly sends the file
to the streaming parser, as it does in one process; a small file is read by one process alone.

Blocks are made small here (64 KiB) so that a real trace of a few MB is cut into dozens, and any trace counts
as large."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from profiler.traces import reader
from profiler.traces.reader import Trace, read_trace
from profiler.traces.summary import analyze_traces

NCCL = Path("/work/shared/data/traces/a100_2rank_nccl/rank-0.json.gz")

pytestmark = pytest.mark.skipif(not NCCL.exists(), reason="the shared traces are not on this machine")


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "BLOCK_BYTES", 64 * 2**10)
    monkeypatch.setattr(reader, "PARALLEL_BYTES", 0)


def assert_same_trace(got: Trace, want: Trace) -> None:
    assert got.events.equals(want.events)
    assert (got.names, got.cats, got.threads, got.base_us) == (want.names, want.cats, want.threads, want.base_us)
    assert got.comms.equals(want.comms) and got.meta == want.meta


def test_blocks_parsed_by_two_processes_are_the_trace_one_process_reads(small_blocks: None) -> None:
    one, two = read_trace(NCCL, workers=1), read_trace(NCCL, workers=2)
    assert (one.readers, two.readers) == (1, 2)
    assert len(one.events) > 20_000 and len(one.comms) > 0  # many blocks, collectives among them
    assert_same_trace(two, one)
    assert np.array_equal(two.events["ts"].to_numpy(), one.events["ts"].to_numpy())  # to the last bit


def test_a_trace_read_by_two_processes_gives_the_figures_one_process_gives(small_blocks: None) -> None:
    one, two = analyze_traces([NCCL], workers=1), analyze_traces([NCCL], workers=2)
    assert one.read == {"workers": 1, "scheduler": "processes"}
    assert two.read == {"workers": 2, "scheduler": "processes"}
    assert json.dumps(two.per_rank, sort_keys=True, default=str) == json.dumps(one.per_rank, sort_keys=True,
                                                                               default=str)
    for table in ("steps", "ops", "kernels"):
        assert two.table(table).equals(one.table(table)), table


def test_a_block_a_worker_cannot_parse_sends_the_file_to_the_streaming_parser(small_blocks: None,
                                                                            tmp_path: Path) -> None:
    # names holding `}, {`: the fast path's cut lands inside a string and the block it sends is not JSON
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op}}, {{{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5}
              for i in range(20_000)]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))
    streamed = read_trace(path, workers=1)
    read = read_trace(path, workers=2)  # a worker's error comes back with its block, as this process's is raised
    assert read.readers == 1 and streamed.readers == 1
    assert_same_trace(read, streamed)
    assert read.names[read.events["name"].to_numpy()[-1]] == "op}, {19999"


def test_a_small_trace_is_read_by_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NCCL.stat().st_size < reader.PARALLEL_BYTES
    assert read_trace(NCCL, workers=2).readers == 1
