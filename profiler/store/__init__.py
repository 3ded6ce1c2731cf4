"""The run store: the only module that reads or writes run directories (docs/run-format.md).

A run directory holds plain files: run.json, steps/samples/ops parquet tables, events.jsonl and
traces/. While a run is live each rank appends to its own part files under parts/ (a background
thread flushes buffered rows every `flush_interval_s`, each part written atomically), so a crash
loses at most one interval and no rank ever writes another's file. When the run ends the parts
are compacted into one table each. Readers accept either form, so a run killed with SIGKILL is
still readable; its stale heartbeat marks it `incomplete`.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1
TABLES = ("steps", "samples", "ops")
OPTIONAL_TABLES = ("kernels",)
"""Tables only some runs have (kernels: GPU kernel aggregates of imported traces); absent reads as empty."""
FINAL_STATUSES = ("completed", "failed", "interrupted")
"""Statuses written when a run ends (its parts compacted into the tables)."""
STALE_AFTER_S = 60.0
"""A `running` run from another host whose heartbeats are all older than this is `incomplete`."""


class StoreError(ValueError):
    """A run directory or runs directory that cannot be used; the message says what is wrong."""


def default_runs_dir(cli_value: str | Path | None = None) -> Path:
    """--runs-dir, else $GLMPERF_RUNS, else ./runs."""
    return Path(cli_value or os.environ.get("GLMPERF_RUNS") or "runs")


def check_runs_dir(runs_dir: Path) -> None:
    """Make sure runs can be created under `runs_dir` (creating it), before any work starts."""
    if runs_dir.exists() and not runs_dir.is_dir():
        raise StoreError(f"runs directory {runs_dir} is a file, not a directory")
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        probe = runs_dir / f".probe-{os.getpid()}-{secrets.token_hex(3)}"
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise StoreError(f"runs directory {runs_dir} is not writable: {exc.strerror or exc}") from None


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def new_dir(parent: Path, name: str) -> Path:
    """A new directory `<UTC stamp>-<name>-<random>` under `parent`, never one that exists."""
    parent.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40] or "run"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    while True:
        path = parent / f"{stamp}-{safe}-{secrets.token_hex(3)}"
        try:
            path.mkdir()  # atomic: two runs started at once never share a directory
            return path
        except FileExistsError:
            continue


def create_run(runs_dir: Path, name: str, record: dict[str, Any]) -> Path:
    """Make a new run directory (never reusing one) and its run.json with status `running`."""
    run_dir = new_dir(runs_dir, name)
    run_id = run_dir.name
    (run_dir / "parts").mkdir()
    (run_dir / "traces").mkdir()
    write_json_atomic(run_dir / "run.json", {
        "schema_version": SCHEMA_VERSION, "id": run_id, "name": name, "status": "running",
        "created": utc_now(), "ended": None, "pid": os.getpid(), "host": os.uname().nodename,
        **record})
    return run_dir


def _read_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not path.is_file():
        raise StoreError(f"{run_dir} is not a run directory (no run.json)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} is not valid JSON (truncated or damaged: {exc})") from None
    if not isinstance(record, dict) or "status" not in record:
        raise StoreError(f"{path} is not a run record (no status)")
    return record


def read_run(run_dir: Path) -> dict[str, Any]:
    """run.json, with `status` turned to `incomplete` when a `running` run has gone silent.

    Raises StoreError, saying what is wrong, when there is no readable run record.
    """
    record = _read_record(run_dir)
    if record.get("status") == "running" and _is_stale(run_dir, record):
        record["status"] = "incomplete"
    return record


def update_run(run_dir: Path, **fields: Any) -> dict[str, Any]:
    record = _read_record(run_dir)
    record.update(fields)
    write_json_atomic(run_dir / "run.json", record)
    return record


def file_problems(run_dir: Path, record: dict[str, Any]) -> list[str]:
    """What is missing or unreadable among a run's tables (cheap: parquet footers only)."""
    problems = []
    for table in TABLES:
        path = run_dir / f"{table}.parquet"
        if not path.exists():
            if record.get("status") in FINAL_STATUSES and not _part_files(run_dir, table):
                problems.append(f"{path.name} is missing")
            continue
        try:
            pq.read_metadata(path)
        except (OSError, pa.ArrowException) as exc:
            problems.append(f"{path.name} is not readable parquet (truncated or damaged: {exc})")
    return problems


def resolve_run(ref: str | Path, runs_dir: Path) -> Path:
    """A run directory from what a user typed: a path, a run id in `runs_dir`, or a run name (latest)."""
    path = Path(ref)
    if path.is_dir():  # whether it holds a run is for the reader to say
        return path
    if (runs_dir / str(ref)).is_dir():
        return runs_dir / str(ref)
    named = [r for r in list_runs(runs_dir) if r.get("name") == str(ref)]
    if named:
        return Path(named[0]["path"])
    raise StoreError(f"no run {str(ref)!r}: not a run directory, nor a run id or name in {runs_dir} "
                     "(`glmperf runs` lists them)")


def _is_stale(run_dir: Path, record: dict[str, Any]) -> bool:
    """Gone silent: on this host, the run's process is dead; elsewhere, its heartbeats are old."""
    if record.get("host") == os.uname().nodename and record.get("pid"):
        try:
            os.kill(record["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    beats = [p.stat().st_mtime for p in (run_dir / "parts").glob("heartbeat-r*")]
    last = max(beats, default=(run_dir / "run.json").stat().st_mtime)
    return time.time() - last > STALE_AFTER_S


class RunWriter:
    """One rank's buffered writer; a daemon thread flushes to part files off the training thread."""

    def __init__(self, run_dir: Path, *, rank: int = 0, flush_interval_s: float = 2.0) -> None:
        self.run_dir, self.rank = run_dir, rank
        self.parts = run_dir / "parts"
        self.parts.mkdir(parents=True, exist_ok=True)
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
        line = json.dumps({"ts": time.time(), "rank": self.rank, **event}, default=str)
        with self._lock:
            self._events.write(line + "\n")
            self._events.flush()

    def trace_path(self, rank: int) -> Path:
        return self.run_dir / "traces" / f"rank{rank}.json.gz"

    def _add(self, table: str, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self._buffers[table].extend(rows)

    def _beat(self) -> None:
        (self.parts / f"heartbeat-r{self.rank}").write_text(str(time.time()))

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
                final = self.parts / f"{table}-r{self.rank}-{self._seq:06d}.parquet"
                tmp = final.with_name("." + final.name + ".tmp")
                _write_parquet(rows, tmp)
                os.replace(tmp, final)
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


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """pyarrow straight from the rows: ~3x less CPU than through pandas (this runs beside training)."""
    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types in a column: let pandas reconcile them
        table = pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False)
    pq.write_table(table, path)


def _part_files(run_dir: Path, table: str) -> list[Path]:
    return sorted((run_dir / "parts").glob(f"{table}-r*-*.parquet")) if (run_dir / "parts").is_dir() else []


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"{path} is not readable parquet (truncated or damaged: {exc})") from None


def read_table(run_dir: Path, table: str) -> pd.DataFrame:
    """A table of the run: the compacted file if there is one, else the live parts concatenated.

    Raises StoreError naming the file when it is not readable parquet.
    """
    if table not in TABLES + OPTIONAL_TABLES:
        raise ValueError(f"unknown table {table!r}; known: {', '.join(TABLES + OPTIONAL_TABLES)}")
    path = run_dir / f"{table}.parquet"
    if path.exists():
        return _read_parquet(path)
    frames = [_read_parquet(p) for p in _part_files(run_dir, table)]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    sort = [c for c in ("step", "rank", "ts") if c in df.columns]
    return df.sort_values(sort, kind="stable", ignore_index=True) if sort else df


def write_table(run_dir: Path, table: str, df: pd.DataFrame) -> None:
    """Write a whole table at once, atomically (a run made in one go, e.g. imported traces)."""
    if table not in TABLES + OPTIONAL_TABLES:
        raise ValueError(f"unknown table {table!r}; known: {', '.join(TABLES + OPTIONAL_TABLES)}")
    tmp = run_dir / f".{table}.parquet.tmp"
    df.to_parquet(tmp, index=False)
    os.replace(tmp, run_dir / f"{table}.parquet")


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    files = [run_dir / "events.jsonl"] if (run_dir / "events.jsonl").exists() else \
        sorted((run_dir / "parts").glob("events-r*.jsonl"))
    events: list[dict[str, Any]] = []
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by a kill
                    continue
    return sorted(events, key=lambda e: e.get("ts", 0))


def compact(run_dir: Path) -> None:
    """Fold every rank's parts into steps/samples/ops.parquet and events.jsonl, then drop the parts."""
    for table in TABLES:
        parts = _part_files(run_dir, table)
        df = read_table(run_dir, table)
        if not df.empty or not (run_dir / f"{table}.parquet").exists():
            tmp = run_dir / f".{table}.parquet.tmp"
            df.to_parquet(tmp, index=False)
            os.replace(tmp, run_dir / f"{table}.parquet")
        for p in parts:
            p.unlink()
    events = read_events(run_dir)
    tmp = run_dir / ".events.jsonl.tmp"
    tmp.write_text("".join(json.dumps(e, default=str) + "\n" for e in events), encoding="utf-8")
    os.replace(tmp, run_dir / "events.jsonl")
    for p in (run_dir / "parts").glob("events-r*.jsonl"):
        p.unlink()


def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Every run under `runs_dir`, newest first, each with its `path`.

    A run whose record or tables cannot be read is listed too, with status `corrupt` and its
    `problems`; a directory without run.json is not a run and is skipped.
    """
    if not runs_dir.is_dir():
        return []
    out = []
    for run_json in runs_dir.glob("*/run.json"):
        run_dir = run_json.parent
        try:
            record = read_run(run_dir)
        except StoreError as exc:
            created = datetime.fromtimestamp(run_json.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
            record = {"id": run_dir.name, "status": "corrupt", "problems": [str(exc)], "created": created}
        else:
            problems = file_problems(run_dir, record)
            if problems:
                record = {**record, "stored_status": record["status"], "status": "corrupt", "problems": problems}
        out.append({**record, "path": str(run_dir)})
    return sorted(out, key=lambda r: r.get("created") or "", reverse=True)


LAUNCHER_LOG = "launcher.log"


def launcher_log(run_dir: Path) -> Any:
    """The run's launcher.log opened for appending: torchrun's and the ranks' stderr go there."""
    return open(run_dir / LAUNCHER_LOG, "ab")  # noqa: SIM115 - the caller's `with` closes it


def read_launcher_log(run_dir: Path) -> str:
    path = run_dir / LAUNCHER_LOG
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def report_path(run_dir: Path) -> Path | None:
    """The run's HTML report, when one was rendered."""
    path = run_dir / "report.html"
    return path if path.is_file() else None


def trace_paths(run_dir: Path) -> list[Path]:
    """The run's chrome traces, one per rank (traces/rank<r>.json.gz)."""
    return sorted((run_dir / "traces").glob("rank*.json.gz"))


def rank_status_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "parts" / f"status-r{rank}.json"


def write_rank_status(run_dir: Path, rank: int, status: str, **fields: Any) -> None:
    write_json_atomic(rank_status_path(run_dir, rank), {"rank": rank, "status": status, **fields})


def read_rank_statuses(run_dir: Path) -> list[dict[str, Any]]:
    """Each rank's own record of how it is doing (`running` from its start, then how it ended)."""
    out = []
    for path in sorted((run_dir / "parts").glob("status-r*.json"), key=lambda p: int(p.stem[len("status-r"):])):
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return out
