"""Read one chrome trace (torch.profiler / Kineto JSON, gzip or not) into columns, in one pass.

Traces are often hundreds of MB; HTA builds a Python object per event of the whole file and then a
DataFrame of it. Here the decompressed text is read in blocks: each block, cut after its last complete
event, is parsed (msgspec, else orjson) as a JSON array of events, and only the fields the analyzers use
are kept, as numpy columns (names and categories as codes into string tables): memory stays at the
columns plus one block. A block that does not cut cleanly (odd formatting) sends the whole file to
ijson's streaming parser, which is slower but reads any valid JSON.

Only complete events (`ph` "X", with a `dur` and a `cat`) are kept, the ones every analysis here
uses (metadata, flow, instant and counter events are skipped, as HTA does), with the process group's
args of the few that name a `Collective name` in a frame of their own (profiler.traces.comm_args).

Times keep the trace's own digits: `ts` is read from its text as the whole microseconds after the
trace's base (its first event's) plus the fraction. Parsed as one float64, an epoch-scale time
(1.7e15 us, older Kineto traces) keeps only quarter microseconds, and the nanoseconds Kineto writes
are lost.
"""

from __future__ import annotations

import functools
import gzip
import io
import itertools
import operator
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import GenericAlias
from typing import Any

import numpy as np
import orjson
import pandas as pd

from profiler.traces import comm_args

BLOCK_BYTES = 2 * 2**20
"""Decompressed bytes parsed at a time: a block's decoded events stay in cache and memory holds little more than
the columns (a 128 MB trace: 16 MB blocks read in 1.22 s at +160 MB of RSS, 2 MB ones in 0.97 s at +94 MB)."""
TYPED = ("c10d::", "_c10d_functional::", "gloo:", "nccl:")
"""Events whose `Input type` is kept: the process group's operators and the backends' (dtypes give their bytes)."""
HEADER_LIMIT = 64 * 2**20
"""Bytes before `"traceEvents"` beyond which a file is not a trace (its header is a few KB)."""


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
    """The whole us subtracted from every `ts` (module docstring): the file's time is `ts + base_us`."""

    def codes(self, table: list[str], wanted: Iterable[str]) -> list[int]:
        """The codes of the `wanted` strings that occur in `table` (names, cats or threads; a category
        can sit at two codes once an old name is read as its new one)."""
        wanted = set(wanted)
        return [i for i, s in enumerate(table) if s in wanted]


OLD_CATEGORIES = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
                  "Memset": "gpu_memset"}
"""PyTorch 1.8-1.9 traces' categories (the TensorBoard plugin's samples), read as today's."""

FIELDS = ("cat", "name", "thread", "pid", "ts", "dur", "stream", "correlation", "external_id", "input_dims",
          "input_types", "flops")

try:  # msgspec decodes straight into typed records, skipping the fields not named: ~2.5x orjson here
    import msgspec

    # gc=False: records of strings and numbers make no cycles, and untracked they spare the collector its passes
    # over each block's hundred thousand of them (half the decoding time); a collective's args kept raw, decoded
    # only where an event names one (a list of ranks, a count as text: whatever it is)
    _Args: Any = msgspec.defstruct("_Args", [
        ("stream", int, -1), ("correlation", int, -1), ("flops", float | None, None),
        ("external_id", int, msgspec.field(default=-1, name="External id")),
        ("input_dims", msgspec.Raw, msgspec.field(default=msgspec.Raw(b"null"), name="Input Dims")),
        ("input_types", msgspec.Raw, msgspec.field(default=msgspec.Raw(b"null"), name="Input type")),
        *[(f, msgspec.Raw, msgspec.field(default=msgspec.Raw(), name=key)) for f, key in comm_args.ARGS.items()]],
        gc=False)

    class _Event(msgspec.Struct, tag_field="ph", tag="X", gc=False):
        """A complete event, the only kind kept."""

        cat: str | None = None
        name: str = ""
        pid: int | str = -1
        tid: int | str = -1
        ts: msgspec.Raw = msgspec.Raw(b"0")
        dur: float | None = None
        args: _Args | None = None

    _SKIPPED = tuple(msgspec.defstruct(f"_Skipped{ord(ph)}", [], tag_field="ph", tag=ph, gc=False)
                     for ph in "BEiIbnesftMCPONDRc()")
    """The other phases of the trace event format: decoded to an empty record, their fields skipped."""

    # list[_Event | _Skipped66 | ...]: a union built at run time
    _DECODER: Any = msgspec.json.Decoder(GenericAlias(list, functools.reduce(operator.or_, _SKIPPED, _Event)))
    _NO_ARGS = _Args()
except ImportError:  # orjson's dicts: the same columns, slower
    _DECODER = None


def _is_complete(ph: Any, cat: Any, dur: Any) -> bool:
    return dur is not None and cat is not None and cat != "Trace" and ph == "X"


def _records(events: list[Any]) -> dict[str, Any]:
    """The kept fields of the complete events of `events` (typed records), field by field."""
    xs = [e for e in events if type(e) is _Event and e.dur is not None and e.cat is not None and e.cat != "Trace"]
    args = [e.args or _NO_ARGS for e in xs]
    return {"cat": [e.cat for e in xs], "name": [e.name for e in xs], "pid": [e.pid for e in xs],
            "tid": [e.tid for e in xs], "ts": b" ".join([e.ts for e in xs]).split(), "dur": [e.dur for e in xs],
            "stream": [a.stream for a in args], "correlation": [a.correlation for a in args],
            "external_id": [a.external_id for a in args],
            "input_dims": [bytes(a.input_dims) for a in args],
            "input_types": [bytes(a.input_types) if e.name.startswith(TYPED) else b"null"
                            for e, a in zip(xs, args, strict=True)],
            "flops": [a.flops for a in args],
            "comms": comm_args.of_records(args)}


def _dicts(events: Iterable[Any]) -> dict[str, Any]:
    """The same from plain JSON objects (orjson or ijson), checking what the typed records check."""
    xs = []
    for e in events:
        if not isinstance(e, dict):
            raise ValueError(f"an event is not a JSON object: {str(e)[:60]!r}")
        if _is_complete(e.get("ph", "X"), e.get("cat"), e.get("dur")):
            xs.append(e)
    args = [e.get("args") or {} for e in xs]
    dims = [a.get("Input Dims") for a in args]
    types = [a.get("Input type") for a in args]
    return {"cat": [e["cat"] for e in xs], "name": [str(e.get("name", "")) for e in xs],
            "pid": [e.get("pid", -1) for e in xs], "tid": [e.get("tid", -1) for e in xs],
            "ts": [str(e["ts"]).encode() for e in xs], "dur": [float(e["dur"]) for e in xs],
            "stream": [_int(a.get("stream", -1)) for a in args],
            "correlation": [_int(a.get("correlation", -1)) for a in args],
            "external_id": [_int(a.get("External id", -1)) for a in args],
            "input_dims": [None if d is None else str(d) for d in dims],
            "input_types": [None if t is None or not str(e.get("name", "")).startswith(TYPED) else str(t)
                            for e, t in zip(xs, types, strict=True)],
            "flops": [float(f) if isinstance(f, (int, float, Decimal)) else None
                      for f in (a.get("flops") for a in args)],
            "comms": comm_args.of_dicts(args)}


class _Columns:
    """Columns grown block by block: numpy arrays, strings as codes into tables shared by all blocks."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
        self.comms: list[pd.DataFrame] = []
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.threads: dict[str, int] = {}
        self.size = 0
        self.base: int | None = None
        """Trace.base_us: the first event's whole us."""

    @staticmethod
    def _codes(values: list[Any], table: dict[str, int], text: Any = str) -> np.ndarray:
        codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=True)
        mapped = np.array([-1 if u == b"null" else table.setdefault(text(u), len(table)) for u in uniques] + [-1],
                          dtype=np.int32)  # codes: 4 bytes an event each, not 8
        return mapped[codes]

    def add(self, fields: dict[str, Any]) -> None:
        n = len(fields["ts"])
        if not n:
            return
        put = self.parts
        put["cat"].append(self._codes(fields["cat"], self.cats))
        put["name"].append(self._codes(fields["name"], self.names))
        for f in ("input_dims", "input_types"):
            put[f].append(self._codes(fields[f], self.names, _dims_text))
        pids, pid_values = pd.factorize(pd.Series(fields["pid"], dtype=object))
        tids, tid_values = pd.factorize(pd.Series(fields["tid"], dtype=object))
        pairs, pair_values = pd.factorize(pids * len(tid_values) + tids)
        put["thread"].append(np.array([self.threads.setdefault(
            f"{pid_values[v // len(tid_values)]}/{tid_values[v % len(tid_values)]}", len(self.threads))
            for v in pair_values.tolist()], dtype=np.int32)[pairs])
        put["pid"].append(np.array([p if isinstance(p, int) else -1 for p in fields["pid"]], dtype=np.int64))
        put["ts"].append(self._times(fields["ts"]))
        put["dur"].append(np.asarray(fields["dur"], dtype=np.float64))
        put["flops"].append(np.array([np.nan if f is None else f for f in fields["flops"]], dtype=np.float64))
        for f in ("stream", "correlation", "external_id"):
            put[f].append(np.asarray(fields[f], dtype=np.int64))
        self.comms.append(comm_args.frame(fields["comms"], first_row=self.size))
        self.size += n

    def _times(self, texts: list[bytes]) -> np.ndarray:
        """The times `texts` in us after the trace's base: the whole us subtracted as integers, then the fraction
        added, so that float64 keeps every digit."""
        whole, fraction = _split_number(texts)
        if self.base is None:
            self.base = int(whole[0])
        return (whole - self.base).astype(np.float64) + fraction

    def frame(self) -> pd.DataFrame:
        """The columns as one frame, each block's parts freed as its column is joined (no second copy)."""
        return pd.DataFrame({f: np.concatenate(self.parts.pop(f)) for f in FIELDS}, copy=False)


def _split_number(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """JSON numbers from their text as whole part (int64) and fraction (float64, with the number's sign)."""
    text = np.array(texts, dtype=np.bytes_)
    head, _, digits = np.strings.partition(text, b".")
    digits = np.strings.add(digits, b"0")  # "" (an integer) reads as 0
    if text.dtype.itemsize > 24 or (np.strings.find(digits, b"e") >= 0).any() or \
            (np.strings.find(digits, b"E") >= 0).any():  # not Kineto's: float64's digits
        value = text.astype(np.float64)
        whole = np.floor(value)
        return whole.astype(np.int64), value - whole
    fraction = digits.astype(np.int64) / 10.0 ** np.strings.str_len(digits)
    return head.astype(np.int64), np.where(np.strings.startswith(text, b"-"), -fraction, fraction)


def _dims_text(value: Any) -> str:
    """Input shapes as profile-run's ops.parquet writes them (`[[2, 3], []]`), from raw JSON or text."""
    return str(orjson.loads(value)) if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    """A stream or id as an int; -1 for what is not one (HTA sets such streams to -1 too)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _open(path: Path) -> io.BufferedIOBase:
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")  # noqa: SIM115 - the caller's `with` closes it


def _blocks(fh: io.BufferedIOBase) -> Iterator[bytes]:
    while True:
        block = fh.read(BLOCK_BYTES)
        if not block:
            return
        yield block


class _NotFast(Exception):
    """The fast path cannot cut this file into events; the streaming parser reads it instead."""


def _fast_read(fh: io.BufferedIOBase, columns: _Columns) -> dict[str, Any]:
    """Parse block by block (module docstring); returns the top-level fields other than traceEvents."""
    blocks = _blocks(fh)
    head = b""
    for block in blocks:
        head += block
        start = head.find(b'"traceEvents"')
        if start >= 0:
            break
        if len(head) > HEADER_LIMIT or head.lstrip()[:1] not in (b"{", b""):
            raise _NotFast
    else:
        raise _NotFast
    bracket = head.find(b"[", start)
    if bracket < 0 or head[start + len(b'"traceEvents"'):bracket].strip() != b":":
        raise _NotFast
    before = head[:start].rstrip()
    meta = orjson.loads(before[:-1] + b"}") if before.endswith(b",") else {}
    buf = bytearray(b"[") + head[bracket + 1:]  # buf[0] opens the array of each run of events parsed
    for block in blocks:
        buf += block
        end, comma = _last_event_end(buf)
        if end > 0:
            columns.add(_loads_array(buf, end))
            del buf[1:comma + 1]  # moves only the rest after the cut
    # the rest: the last events, "]", and the fields after the array
    for end in _positions(buf, b"]", tries=4096):
        tail = bytes(buf[end + 1:]).strip()
        try:  # the fields after the array, e.g. `, "traceName": ..., "INFO": ["...]", ...] }`
            footer = {} if tail == b"}" else orjson.loads(b"{" + tail.removeprefix(b",")) if tail[:1] == b"," else None
            if isinstance(footer, dict):
                columns.add(_loads_array(buf, end))
                return {**meta, **footer}
        except (orjson.JSONDecodeError, _NotFast):
            continue
    raise _NotFast


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


def _loads_array(buf: bytearray, end: int) -> dict[str, Any]:
    """The events of buf[:end + 1] as fields, buf[0] being `[` and buf[end] made `]` for the parse
    (restored after); _NotFast where that is not a run of whole events."""
    saved, buf[end] = buf[end], ord("]")
    try:
        with memoryview(buf) as view, view[:end + 1] as text:
            if _DECODER is not None:
                return _records(_DECODER.decode(text))
            return _dicts(orjson.loads(text))
    except ValueError:  # msgspec's and orjson's decode errors are ValueErrors
        raise _NotFast from None
    finally:
        buf[end] = saved


def _stream_read(path: Path, columns: _Columns) -> dict[str, Any]:
    """Any valid JSON, through ijson's C parser: slower, same result."""
    import ijson

    with _open(path) as fh:
        events = ijson.items(fh, "traceEvents.item")  # numbers as Decimal: the times' digits kept
        while batch := list(itertools.islice(events, 50_000)):
            columns.add(_dicts(batch))
    meta: dict[str, Any] = {}
    for key in ("distributedInfo", "deviceProperties"):
        with _open(path) as fh:
            value = next(ijson.items(fh, key, use_float=True), None)
        if value is not None:
            meta[key] = value
    return meta


def read_trace(path: str | Path) -> Trace:
    """Read a chrome trace; raises TraceError naming the file and what is wrong (empty, truncated,
    not JSON, not a trace, no complete events)."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise TraceError(f"{path}: the file is empty")
        columns = _Columns()
        try:
            with _open(path) as fh:
                meta = _fast_read(fh, columns)
        except (_NotFast, ValueError):
            columns = _Columns()
            meta = _stream_read(path, columns)
    except TraceError:
        raise
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: the gzip stream is truncated or damaged ({exc})") from None
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
    return Trace(path=path, meta=meta, events=columns.frame(), names=list(columns.names),
                 cats=[OLD_CATEGORIES.get(c, c) for c in columns.cats], threads=list(columns.threads),
                 base_us=columns.base or 0, comms=comm_args.joined(columns.comms))
