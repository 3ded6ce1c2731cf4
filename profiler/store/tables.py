"""A run's tables and events: the parts each rank flushes while it runs, and their compaction.

While a run is live each rank appends to its own part files under parts/ (a background thread
flushes buffered rows every `flush_interval_s`, each part written atomically), so a crash loses at
most one interval and no rank ever writes another's file. Every writer is one attempt of its rank
(the run directory started again after a requeue or a checkpoint resume is attempt 2, ...): its parts
are named by it and its rows carry it, so no attempt overwrites another's.

A table is its compacted file merged with every part not yet folded into it, deduplicated by its key
(the latest write of a row wins), so readers see every flushed row whatever stage the run is at, and
a compaction stopped halfway (Ctrl-C, a full disk) loses nothing and counts nothing twice.
"""

from __future__ import annotations

import json
import re
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profiler.store.files import StoreError, atomic_write, disk_error, plain

TABLES = ("steps", "samples", "ops")
OPTIONAL_TABLES = ("kernels",)
"""Tables only some runs have (kernels: GPU kernel aggregates of imported traces); absent reads as empty."""
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "steps": ("step", "rank", "step_s", "tokens", "loss"), "samples": ("ts", "rank"),
    "ops": ("rank", "name", "input_shapes", "calls", "steps")}
"""What a readable table holds at least: what the summary and the analyzers read."""
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "steps": ("attempt", "rank", "step"), "samples": ("attempt", "rank", "device", "source", "ts"),
    "ops": ("attempt", "rank", "name", "input_shapes")}
"""What one row is about: two rows with the same key are one row written twice (the later one is kept)."""
_PART = re.compile(r"^[a-z]+-r(\d+)-(?:a(\d+)-)?\d+\.parquet$")


def _part_files(run_dir: Path, table: str) -> list[Path]:
    """The table's parts in the order they were written (a rank's attempts in turn, then its sequence)."""
    parts = run_dir / "parts"
    return sorted(parts.glob(f"{table}-r*-*.parquet")) if parts.is_dir() else []


def _heartbeat_attempt(path: Path) -> int:
    """The attempt a heartbeat names: 0 without one, 1 for one of a glmperf that did not number them."""
    try:
        beat = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        return 0
    except ValueError:
        return 1
    attempt = beat.get("attempt") if isinstance(beat, dict) else None
    return attempt if isinstance(attempt, int) else 1


def last_attempt(run_dir: Path, rank: int) -> int:
    """The highest attempt of `rank` its heartbeat or its parts record; 0 before its first."""
    parts = run_dir / "parts"
    named = [int(m.group(2) or 1) for p in (parts.glob(f"*-r{rank}-*.parquet") if parts.is_dir() else [])
             if (m := _PART.match(p.name)) and int(m.group(1)) == rank]
    return max([_heartbeat_attempt(parts / f"heartbeat-r{rank}"), *named])


class RunWriter:
    """One rank's buffered writer for one attempt; a daemon thread flushes to part files off the training thread."""

    def __init__(self, run_dir: Path, *, rank: int = 0, flush_interval_s: float = 2.0) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.parts = run_dir / "parts"
        self.parts.mkdir(parents=True, exist_ok=True)
        self.attempt = last_attempt(run_dir, rank) + 1
        self._buffers: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
        self._seq = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._interval = flush_interval_s
        self._events = open(self.parts / f"events-r{rank}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._beat()
        self._thread = threading.Thread(target=self._loop, name=f"glmperf-store-r{rank}", daemon=True)
        self._thread.start()

    # the writer protocol instruments use
    def add_steps(self, rows: list[dict[str, Any]]) -> None:
        self._add("steps", rows)

    def add_samples(self, rows: list[dict[str, Any]]) -> None:
        self._add("samples", rows)

    def add_ops(self, rows: list[dict[str, Any]]) -> None:
        self._add("ops", rows)

    def add_event(self, event: dict[str, Any]) -> None:
        """Events are rare and precious: written and flushed at once, one JSON object a line."""
        line = json.dumps(plain({"ts": time.time(), "rank": self.rank, "attempt": self.attempt, **event}), default=str,
                          allow_nan=False)
        with self._lock:
            self._events.write(line + "\n")
            self._events.flush()

    def trace_path(self, rank: int) -> Path:
        return self.run_dir / "traces" / f"rank{rank}.json.gz"

    def _add(self, table: str, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self._buffers[table].extend(rows)

    def _beat(self) -> None:
        """The heartbeat: its time says the rank is alive, its content which attempt this is."""
        (self.parts / f"heartbeat-r{self.rank}").write_text(json.dumps({"attempt": self.attempt, "ts": time.time()}))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            taken = {t: rows for t, rows in self._buffers.items() if rows}
            self._buffers = {t: [] for t in TABLES}
        with self._write_lock:
            for table, rows in taken.items():
                self._seq += 1
                part = self.parts / f"{table}-r{self.rank}-a{self.attempt}-{self._seq:06d}.parquet"
                arrow = _arrow(rows)
                if "attempt" not in arrow.column_names:
                    arrow = arrow.append_column("attempt", pa.array([self.attempt] * arrow.num_rows, pa.int64()))
                atomic_write(part, partial(pq.write_table, arrow))
            self._beat()

    def close(self) -> None:
        """Stop the thread and write everything still buffered (safe to call twice)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        self.flush()
        with self._lock:
            if not self._events.closed:
                self._events.close()


def _arrow(rows: list[dict[str, Any]]) -> pa.Table:
    """pyarrow straight from the rows: ~3x less CPU than through pandas (this runs beside training)."""
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types in a column: let pandas reconcile them
        return pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False)


def _read_parquet(path: Path, table: str) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise StoreError(f"{path} is not readable parquet (truncated or damaged: {exc})") from None
    missing = [c for c in REQUIRED_COLUMNS.get(table, ()) if c not in df.columns]
    if missing and not df.empty:
        raise StoreError(f"{path} has no column {', '.join(missing)}: not a {table} table "
                         f"(it needs {', '.join(REQUIRED_COLUMNS[table])})")
    return df


def _merged(table: str, frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The frames as one table, in the order they were written; a row written twice (a compaction stopped
    before it removed the parts it had folded in) is kept once, the later write."""
    rows = [f for f in frames if not f.empty]
    if len(rows) < 2:  # nothing to merge (an empty table keeps its columns)
        return rows[0] if rows else (frames[0] if frames else pd.DataFrame())
    df = pd.concat(rows, ignore_index=True)
    if "attempt" in df:  # rows of a glmperf that did not number attempts: the first
        df["attempt"] = df["attempt"].fillna(1).astype("int64")
    keys = [k for k in ROW_KEYS.get(table, ()) if k in df.columns]
    if keys:
        df = df.drop_duplicates(subset=keys, keep="last")
    sort = [c for c in ("step", "rank", "attempt", "ts") if c in df.columns]
    return df.sort_values(sort, kind="stable", ignore_index=True) if sort else df.reset_index(drop=True)


def _check_table(table: str) -> None:
    if table not in TABLES + OPTIONAL_TABLES:
        raise ValueError(f"unknown table {table!r}; known: {', '.join(TABLES + OPTIONAL_TABLES)}")


def read_table(run_dir: Path, table: str) -> pd.DataFrame:
    """A table of the run: its compacted file merged with the parts flushed since (every attempt's).

    Raises StoreError naming the file when one is not readable parquet or not that table.
    """
    _check_table(table)
    path = run_dir / f"{table}.parquet"
    compacted = [_read_parquet(path, table)] if path.exists() else []
    return _merged(table, compacted + [_read_parquet(p, table) for p in _part_files(run_dir, table)])


def write_table(run_dir: Path, table: str, df: pd.DataFrame) -> None:
    """Write a whole table at once, atomically (a run made in one go, e.g. imported traces)."""
    _check_table(table)
    atomic_write(run_dir / f"{table}.parquet", partial(df.to_parquet, index=False))


def read_events(run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """The run's events (events.jsonl and the parts' events not yet folded into it), oldest first, and how
    many lines were skipped: cut short by a kill, not UTF-8, not a JSON object, or a time that is no number."""
    files = [run_dir / "events.jsonl"] if (run_dir / "events.jsonl").exists() else []
    files += sorted((run_dir / "parts").glob("events-r*.jsonl"))
    events: dict[str, dict[str, Any]] = {}  # by content: an event folded in and still in its part counts once
    skipped = 0
    for path in files:
        try:
            lines = path.read_bytes().splitlines()
        except OSError as exc:
            raise disk_error(exc, "reading", path) from None
        for line in filter(bytes.strip, lines):
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            ts = event.get("ts", 0) if isinstance(event, dict) else None
            if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                skipped += 1
                continue
            events.setdefault(json.dumps(event, sort_keys=True, default=str), event)
    return sorted(events.values(), key=lambda e: e.get("ts", 0)), skipped


def compact(run_dir: Path) -> int:
    """Fold every part into steps/samples/ops.parquet and events.jsonl, merged with what they hold already,
    then remove the parts folded in (never one flushed after it read them). Returns the event lines skipped.

    Each file is replaced atomically before its parts are removed, so stopping at any point (Ctrl-C, a full
    disk: a StoreError naming the file) leaves every row readable, and compacting again finishes the job.
    """
    for table in TABLES:
        parts = _part_files(run_dir, table)
        path = run_dir / f"{table}.parquet"
        if path.exists() and not parts:
            continue
        df = read_table(run_dir, table) if parts else pd.DataFrame()
        atomic_write(path, partial(df.to_parquet, index=False))
        _remove(parts)
    event_parts = sorted((run_dir / "parts").glob("events-r*.jsonl"))
    events, skipped = read_events(run_dir)
    text = "".join(json.dumps(plain(e), default=str, allow_nan=False) + "\n" for e in events)
    atomic_write(run_dir / "events.jsonl", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    _remove(event_parts)
    return skipped


def _remove(paths: list[Path]) -> None:
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError as exc:
            raise disk_error(exc, "removing", p) from None
