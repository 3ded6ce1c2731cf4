"""Read one chrome trace (torch.profiler / Kineto JSON, gzip or not) into columns, in one pass.

Traces are often hundreds of MB; HTA builds a Python object per event of the whole file and then a
DataFrame of it. Here the decompressed text is read in blocks: each block, cut after its last complete
event, is parsed as a JSON array of events into numpy columns (profiler.traces.blocks: only the fields the
analyzers use, names as codes into string tables), so memory stays at the columns plus a few blocks. A
large trace's blocks are parsed by `workers` processes at once while this one reads the file and merges
their columns in order. A block that does not cut cleanly (odd formatting) sends the whole file to ijson's
streaming parser, which is slower but reads any valid JSON.
"""

from __future__ import annotations

import gzip
import io
import itertools
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from profiler.traces import blocks, parallel
from profiler.traces.blocks import Block, Columns, NotFast

BLOCK_BYTES = 2 * 2**20
"""Decompressed bytes parsed at a time: a block's decoded events stay in cache and memory holds little more than
the columns (a 128 MB trace: 16 MB blocks read in 1.22 s at +160 MB of RSS, 2 MB ones in 0.97 s at +94 MB)."""
HEADER_LIMIT = 64 * 2**20
"""Bytes before `"traceEvents"` beyond which a file is not a trace (its header is a few KB)."""
PARALLEL_BYTES = 64 * 2**20
"""A file at least this large on disk has its blocks parsed by worker processes when it is given some: a smaller
one reads in less time than the workers take to start."""
IN_FLIGHT = 4
"""Blocks a worker may hold before the next is parsed here: with the merged blocks waiting on the oldest (at most
IN_FLIGHT per process), what bounds the memory of blocks in flight."""


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and what is wrong with it."""


@dataclass
class Trace:
    """One rank's complete events as columns, and the trace's top-level fields (`distributedInfo`, ...)."""

    path: Path
    meta: dict[str, Any]
    events: pd.DataFrame
    """Columns: `cat`, `name`, `thread` (codes into `cats`, `names`, `threads`), `pid`, `ts` (us after
    `base_us`), `dur` (us, as in the file), `stream` (-1 off the GPU), `correlation`, `external_id` (-1 when
    absent),
    `input_dims`, `input_types` (codes into `names`, -1 when absent; types kept on collective events only,
    their one reader: profiler.traces.collectives), `flops` (NaN when absent)."""
    names: list[str]
    cats: list[str]
    threads: list[str]
    comms: pd.DataFrame
    """The events that name a `Collective name`: `row` (their position in `events`), comm_args.ARGS's columns."""
    base_us: int = 0
    """The whole us subtracted from every `ts` (profiler.traces.blocks): the file's time is `ts + base_us`."""
    readers: int = 1
    """The processes that parsed its blocks."""

    def codes(self, table: list[str], wanted: Iterable[str]) -> list[int]:
        """The codes of the `wanted` strings that occur in `table` (names, cats or threads; a category
        can sit at two codes once an old name is read as its new one)."""
        wanted = set(wanted)
        return [i for i, s in enumerate(table) if s in wanted]


OLD_CATEGORIES = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
                  "Memset": "gpu_memset"}
"""PyTorch 1.8-1.9 traces' categories (the TensorBoard plugin's samples), read as today's."""

def _open(path: Path) -> io.BufferedIOBase:
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")  # noqa: SIM115 - the caller's `with` closes it


def _chunks(fh: io.BufferedIOBase) -> Iterator[bytes]:
    while True:
        chunk = fh.read(BLOCK_BYTES)
        if not chunk:
            return
        yield chunk


Parse = Callable[[bytearray], "Future[Block]"]
"""Parse a JSON array of whole events (blocks.parse), now or in a worker."""


def _parsed_here(text: bytearray) -> Future[Block]:
    done: Future[Block] = Future()
    try:
        done.set_result(blocks.parse(text))
    except NotFast as exc:
        done.set_exception(exc)
    return done


@contextmanager
def _parsers(workers: int) -> Iterator[Parse]:
    """Where blocks are parsed: this process and `workers - 1` more (profiler.traces.parallel's). A block goes to
    a worker while they have fewer than IN_FLIGHT each, else it is parsed here: this process, which reads the
    file, parses whenever the workers are ahead, and none waits for the workers to start."""
    if workers <= 1:
        yield _parsed_here
        return
    sent: set[Future[Block]] = set()

    def parse(text: bytearray) -> Future[Block]:
        sent.difference_update([f for f in sent if f.done()])
        if len(sent) >= IN_FLIGHT * (workers - 1):
            return _parsed_here(text)
        future = executor.submit(blocks.parse, text)
        sent.add(future)
        return future

    with parallel.processes(workers - 1, preload=["profiler.traces.blocks"]) as executor:
        yield parse


def _fast_read(fh: io.BufferedIOBase, columns: Columns, workers: int = 1) -> dict[str, Any]:
    """Parse block by block (module docstring); returns the top-level fields other than traceEvents."""
    chunks = _chunks(fh)
    head = b""
    for chunk in chunks:
        head += chunk
        start = head.find(b'"traceEvents"')
        if start >= 0:
            break
        if len(head) > HEADER_LIMIT or head.lstrip()[:1] not in (b"{", b""):
            raise NotFast
    else:
        raise NotFast
    bracket = head.find(b"[", start)
    if bracket < 0 or head[start + len(b'"traceEvents"'):bracket].strip() != b":":
        raise NotFast
    before = head[:start].rstrip()
    meta = orjson.loads(before[:-1] + b"}") if before.endswith(b",") else {}
    buf = bytearray(b"[") + head[bracket + 1:]  # buf[0] opens the array of each run of events parsed
    with _parsers(workers) as parse:  # a worker's error (NotFast) is raised where its block is merged
        pending: deque[Future[Block]] = deque()
        for chunk in chunks:
            buf += chunk
            end, comma = _last_event_end(buf)
            if end > 0:
                text = buf[:end + 1]  # a copy: the array's events and the character after their last
                text[-1] = ord("]")
                pending.append(parse(text))
                del buf[1:comma + 1]  # moves only the rest after the cut
            while pending and (pending[0].done() or len(pending) > IN_FLIGHT * workers):
                columns.extend(pending.popleft().result())
        while pending:
            columns.extend(pending.popleft().result())
    # the rest: the last events, "]", and the fields after the array
    for end in _positions(buf, b"]", tries=4096):
        tail = bytes(buf[end + 1:]).strip()
        try:  # the fields after the array, e.g. `, "traceName": ..., "INFO": ["...]", ...] }`
            footer = {} if tail == b"}" else orjson.loads(b"{" + tail.removeprefix(b",")) if tail[:1] == b"," else None
            if isinstance(footer, dict):
                columns.extend(blocks.parse(bytes(buf[:end + 1])))
                return {**meta, **footer}
        except (orjson.JSONDecodeError, NotFast):
            continue
    raise NotFast


def _positions(text: bytes | bytearray, char: bytes, tries: int = 64) -> Iterator[int]:
    """Positions of `char` from the end backwards (at most `tries`)."""
    end = len(text)
    for _ in range(tries):
        end = text.rfind(char, 0, end)
        if end < 0:
            return
        yield end


WHITESPACE = frozenset(b" \t\r\n")


def _last_event_end(text: bytearray) -> tuple[int, int]:
    """(the index of the character after the last `}` that `,` and `{` follow: a likely event boundary,
    the index of that comma), or (0, 0)."""
    for comma in _positions(text, b","):
        after = comma + 1
        while after < len(text) and text[after] in WHITESPACE:
            after += 1
        before = comma - 1
        while before > 0 and text[before] in WHITESPACE:
            before -= 1
        if after < len(text) and text[after] == ord("{") and text[before] == ord("}"):
            return before + 1, comma
    return 0, 0


def _stream_read(path: Path, columns: Columns) -> dict[str, Any]:
    """Any valid JSON, through ijson's C parser: slower, same result."""
    import ijson

    with _open(path) as fh:
        events = ijson.items(fh, "traceEvents.item")  # numbers as Decimal: the times' digits kept
        while batch := list(itertools.islice(events, 50_000)):
            columns.extend(blocks.block(blocks.dicts(batch)))
    meta: dict[str, Any] = {}
    for key in ("distributedInfo", "deviceProperties"):
        with _open(path) as fh:
            value = next(ijson.items(fh, key, use_float=True), None)
        if value is not None:
            meta[key] = value
    return meta


def read_trace(path: str | Path, workers: int = 1) -> Trace:
    """Read a chrome trace, its blocks parsed by `workers` processes where it is large (PARALLEL_BYTES); raises
    TraceError naming the file and what is wrong (empty, truncated, not JSON, not a trace, no complete events)."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise TraceError(f"{path}: the file is empty")
        columns = Columns()
        readers = workers if path.stat().st_size >= PARALLEL_BYTES else 1
        try:
            with _open(path) as fh:
                meta = _fast_read(fh, columns, readers)
        except (NotFast, ValueError):
            columns, readers = Columns(), 1
            meta = _stream_read(path, columns)
    except TraceError:
        raise
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: the gzip stream is truncated or damaged ({exc})") from None
    except BrokenProcessPool as exc:
        raise TraceError(f"{path}: a process parsing it died ({exc}): out of memory? read it again with fewer "
                         "--workers") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except Exception as exc:  # ijson's errors (IncompleteJSONError, ...) share no base class with json's
        text = str(exc) or type(exc).__name__
        what = "truncated (the JSON ends early)" if "incomplete" in text.lower() or "premature" in text.lower() \
            else f"not valid JSON ({text.splitlines()[0][:200]})"
        raise TraceError(f"{path}: {what}") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: not a chrome trace (no traceEvents array)")
    if not columns.size:
        raise TraceError(f"{path}: holds no complete events (ph 'X' with a duration): not a torch.profiler trace, "
                         "or an empty profiling window")
    tables = columns.tables
    return Trace(path=path, meta=meta, events=columns.frame(), names=list(tables["names"]),
                 cats=[OLD_CATEGORIES.get(c, c) for c in tables["cats"]], threads=list(tables["threads"]),
                 base_us=columns.base or 0, comms=columns.comms_frame(), readers=readers)
