"""A run of a trace's events parsed into columns, and the trace's columns merged from such runs in order.

profiler.traces.reader cuts a trace's text into runs of whole events (a few MB each) and has each parsed
here: in its own process, or by worker processes at once (a large trace on many cores). A parsed run is a
`Block`: numpy columns with its strings as codes into its own small tables, so a worker sends back arrays
and a few hundred strings, not a Python object per event. `Columns` merges the blocks in file order, the
codes mapped into the trace's tables, and each time made relative to the trace's first event.

Only complete events (`ph` "X", with a `dur` and a `cat`) are kept, the ones every analysis here uses
(metadata, flow, instant and counter events are skipped, as HTA does), with the process group's args of
the few that name a `Collective name` in a frame of their own (profiler.traces.comm_args).

Times keep the trace's own digits: `ts` is read from its text as the whole microseconds after the
trace's base (its first event's) plus the fraction. Parsed as one float64, an epoch-scale time
(1.7e15 us, older Kineto traces) keeps only quarter microseconds, and the nanoseconds Kineto writes
are lost.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from types import GenericAlias
from typing import Any

import numpy as np
import orjson
import pandas as pd

from profiler.traces import comm_args

TYPED = ("c10d::", "_c10d_functional::", "gloo:", "nccl:")
"""Events whose `Input type` is kept: the process group's operators and the backends' (dtypes give their bytes)."""
FIELDS = ("cat", "name", "thread", "pid", "ts", "dur", "stream", "correlation", "external_id", "input_dims",
          "input_types", "flops")
CODED = {"cat": "cats", "name": "names", "thread": "threads", "input_dims": "names", "input_types": "names"}
"""The columns that are codes, and the table each codes into."""


class NotFast(Exception):
    """A run of text that is not a JSON array of whole events: the reader's streaming parser reads the file."""


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


def dicts(events: Iterable[Any]) -> dict[str, Any]:
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


@dataclass
class Block:
    """A run of events as columns: FIELDS but `ts`, which is `whole` (int64 us) and `fraction` (float64); the
    CODED columns code into this block's own `tables` (-1: absent); `comms`: comm_args.fields's columns."""

    size: int
    columns: dict[str, np.ndarray]
    tables: dict[str, list[str]]
    comms: dict[str, list[Any]]


def parse(text: bytes | bytearray) -> Block:
    """A JSON array of whole events as a Block; NotFast where the text is not one."""
    try:
        fields = _records(_DECODER.decode(text)) if _DECODER is not None else dicts(orjson.loads(text))
    except ValueError:  # msgspec's and orjson's decode errors are ValueErrors
        raise NotFast from None
    return block(fields)


def block(fields: dict[str, Any]) -> Block:
    """`_records`' or `dicts`' fields as a Block."""
    names: dict[str, int] = {}
    tables = {"cats": {}, "names": names, "threads": {}}
    columns = {"cat": _codes(fields["cat"], tables["cats"]), "name": _codes(fields["name"], names),
               "input_dims": _codes(fields["input_dims"], names, _dims_text),
               "input_types": _codes(fields["input_types"], names, _dims_text),
               "thread": _threads(fields["pid"], fields["tid"], tables["threads"]),
               "pid": np.array([p if isinstance(p, int) else -1 for p in fields["pid"]], dtype=np.int64),
               "dur": np.asarray(fields["dur"], dtype=np.float64),
               "flops": np.array([np.nan if f is None else f for f in fields["flops"]], dtype=np.float64)}
    columns["whole"], columns["fraction"] = split_number(fields["ts"])
    for f in ("stream", "correlation", "external_id"):
        columns[f] = np.asarray(fields[f], dtype=np.int64)
    return Block(len(fields["ts"]), columns, {k: list(t) for k, t in tables.items()}, fields["comms"])


def _codes(values: list[Any], table: dict[str, int], text: Any = str) -> np.ndarray:
    codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=True)
    mapped = np.array([-1 if u == b"null" else table.setdefault(text(u), len(table)) for u in uniques] + [-1],
                      dtype=np.int32)  # codes: 4 bytes an event each, not 8
    return mapped[codes]


def _threads(pid: list[Any], tid: list[Any], table: dict[str, int]) -> np.ndarray:
    """Codes of each event's `pid/tid`."""
    pids, pid_values = pd.factorize(pd.Series(pid, dtype=object))
    tids, tid_values = pd.factorize(pd.Series(tid, dtype=object))
    pairs, pair_values = pd.factorize(pids * len(tid_values) + tids)
    return np.array([table.setdefault(f"{pid_values[v // len(tid_values)]}/{tid_values[v % len(tid_values)]}",
                                      len(table)) for v in pair_values.tolist()], dtype=np.int32)[pairs]


@dataclass
class Columns:
    """The trace's columns, merged from its blocks in file order: the codes into tables shared by all blocks."""

    parts: dict[str, list[np.ndarray]] = field(default_factory=lambda: {f: [] for f in FIELDS})
    comms: list[pd.DataFrame] = field(default_factory=list)
    tables: dict[str, dict[str, int]] = field(default_factory=lambda: {"cats": {}, "names": {}, "threads": {}})
    size: int = 0
    base: int | None = None
    """Trace.base_us: the first event's whole us."""

    def extend(self, block: Block) -> None:
        if not block.size:
            return
        got = block.columns
        for f, table in CODED.items():
            into = self.tables[table]
            mapped = np.array([into.setdefault(s, len(into)) for s in block.tables[table]] + [-1], dtype=np.int32)
            self.parts[f].append(mapped[got[f]])  # -1 (absent) takes the last entry: -1
        if self.base is None:
            self.base = int(got["whole"][0])
        self.parts["ts"].append((got["whole"] - self.base).astype(np.float64) + got["fraction"])
        for f in FIELDS:
            if f not in CODED and f != "ts":
                self.parts[f].append(got[f])
        if block.comms["row"]:
            self.comms.append(comm_args.frame(block.comms, first_row=self.size))
        self.size += block.size

    def frame(self) -> pd.DataFrame:
        """The columns as one frame, each block's parts freed as its column is joined (no second copy)."""
        return pd.DataFrame({f: np.concatenate(self.parts.pop(f)) for f in FIELDS}, copy=False)

    def comms_frame(self) -> pd.DataFrame:
        return comm_args.joined(self.comms or [comm_args.frame(comm_args.fields([]), first_row=0)])


def split_number(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """JSON numbers from their text as whole part (int64) and fraction (float64, with the number's sign)."""
    text = np.array(texts, dtype=np.bytes_)
    joined = b" ".join(texts)
    if b"." not in joined and b"e" not in joined and b"E" not in joined:  # integers (older Kineto's us)
        return text.astype(np.int64), np.zeros(len(texts))
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
