"""The run store: the only package that reads or writes run directories (docs/run-format.md).

A run directory holds plain files: run.json, steps/samples/ops parquet tables, events.jsonl and
traces/. This module keeps run.json (created `running`, read and checked, finished by
`profiler.capture.finish`), the listing of runs and the ranks' status records; `tables` the parts the
ranks flush while a run is live and their compaction; `checks` what a readable run.json is; `files`
the atomic writes everything goes through. Readers accept a run at any stage, so a run killed with
SIGKILL is still readable; its silent process marks it `incomplete`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from profiler.store.checks import SCHEMA_VERSION, NewerSchema, check_record
from profiler.store.files import TEMP_NAME, StoreError, disk_error, json_text, plain, utc_now, write_json_atomic
from profiler.store.tables import (
    OPTIONAL_TABLES,
    REQUIRED_COLUMNS,
    TABLES,
    RunWriter,
    _part_files,
    compact,
    last_attempt,
    read_events,
    read_table,
    write_table,
)

__all__ = ["SCHEMA_VERSION", "TABLES", "OPTIONAL_TABLES", "FINAL_STATUSES", "STALE_AFTER_S", "StoreError",
           "NewerSchema", "RunWriter", "compact", "read_events", "read_table", "write_table", "utc_now",
           "disk_error", "json_text", "plain", "write_json_atomic"]

FINAL_STATUSES = ("completed", "failed", "interrupted")
"""Statuses written when a run ends (its parts compacted into the tables)."""
STALE_AFTER_S = 60.0
"""A `running` run from another host whose heartbeats are all older than this is `incomplete`."""


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
        record = json.loads(path.read_bytes())
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise StoreError(f"{path} is not valid JSON (truncated or damaged: {exc})") from None
    return check_record(path, record)


def read_run(run_dir: Path) -> dict[str, Any]:
    """run.json, with `status` turned to `incomplete` when a `running` run has gone silent.

    Raises StoreError, saying what is wrong, when there is no readable run record (NewerSchema when a
    newer glmperf wrote it).
    """
    record = _read_record(run_dir)
    if record["status"] == "running" and alive(run_dir, record) is None:
        record["status"] = "incomplete"
    return record


def update_run(run_dir: Path, **fields: Any) -> dict[str, Any]:
    record = _read_record(run_dir)
    record.update(fields)
    write_json_atomic(run_dir / "run.json", record)
    return record


def file_problems(run_dir: Path, record: dict[str, Any]) -> list[str]:
    """What is missing, unreadable or not that table among a run's tables (cheap: parquet footers only)."""
    problems = []
    for table in TABLES:
        path = run_dir / f"{table}.parquet"
        if not path.exists():
            if record.get("status") in FINAL_STATUSES and not _part_files(run_dir, table):
                problems.append(f"{path.name} is missing")
            continue
        try:
            meta = pq.read_metadata(path)
        except (OSError, pa.ArrowException) as exc:
            problems.append(f"{path.name} is not readable parquet (truncated or damaged: {exc})")
            continue
        missing = [c for c in REQUIRED_COLUMNS[table] if c not in meta.schema.names]
        if missing and meta.num_rows:
            problems.append(f"{path.name} has no column {', '.join(missing)}: not a {table} table")
    return problems


def resolve_run(ref: str | Path, runs_dir: Path) -> Path:
    """A run directory from what a user typed: a path, a run id in `runs_dir`, or a run name (latest)."""
    for path in (Path(ref), runs_dir / str(ref)):
        if _is_dir(path):  # whether it holds a run is for the reader to say
            return path
    named = [r for r in list_runs(runs_dir) if r.get("name") == str(ref)]
    if named:
        return Path(named[0]["path"])
    raise StoreError(f"no run {str(ref)!r}: not a run directory, nor a run id or name in {runs_dir} "
                     "(`glmperf runs` lists them)")


def _is_dir(path: Path) -> bool:
    """Path.is_dir, with a name the system cannot look up (too long, a NUL byte) read as no directory."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _beat_age(run_dir: Path, rank: int) -> float:
    path = run_dir / "parts" / f"heartbeat-r{rank}"
    return time.time() - path.stat().st_mtime if path.exists() else float("inf")


def alive(run_dir: Path, record: dict[str, Any]) -> str | None:
    """What still runs of a `running` run, in words (`pid 123`, `rank 1 on node2, heartbeat 3 s ago`); None
    when nothing does: it was killed, or its ranks all ended and no launcher finalized it.

    On this host its launching process says (it finalizes the run after its ranks); without one (init-run, a
    multi-rank API run), each `running` rank's process here and its heartbeat elsewhere. A run no rank has
    started yet counts as running for STALE_AFTER_S after it was created.
    """
    here = os.uname().nodename
    pid = record.get("pid")
    if pid and record.get("host") == here:
        return f"pid {pid}" if _pid_alive(pid) else None
    ranks = read_rank_statuses(run_dir)
    if not ranks:
        age = time.time() - (run_dir / "run.json").stat().st_mtime
        return "no rank has started yet" if age <= STALE_AFTER_S else None
    for rank in (r for r in ranks if r.get("status") == "running"):
        if rank.get("host") == here and isinstance(rank.get("pid"), int):
            if _pid_alive(rank["pid"]):
                return f"rank {rank['rank']}, pid {rank['pid']}"
        elif (age := _beat_age(run_dir, rank["rank"])) <= STALE_AFTER_S:
            return f"rank {rank['rank']} on {rank.get('host')}, heartbeat {age:.0f} s ago"
    return None


def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Every run under `runs_dir`, newest first, each with its `path`.

    A run whose record or tables cannot be read is listed too, with status `corrupt` (`unreadable` when a
    newer glmperf wrote it) and its `problems`, and no name, so that a lookup by name passes it by; a
    directory without run.json is not a run and is skipped.
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
            status = "unreadable" if isinstance(exc, NewerSchema) else "corrupt"
            record = {"id": run_dir.name, "status": status, "problems": [str(exc)], "created": created}
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
    """The rank's status record, with the attempt its writer is on (profiler.store.tables.RunWriter)."""
    write_json_atomic(rank_status_path(run_dir, rank),
                      {"rank": rank, "status": status, "attempt": last_attempt(run_dir, rank), **fields})


_STATUS_FILE = re.compile(r"^status-r(\d+)\.json$")


def read_rank_statuses(run_dir: Path) -> list[dict[str, Any]]:
    """Each rank's own record of how it is doing (`running` from its start, then how it ended), by rank;
    a file that is not such a record (cut short, damaged) is passed by."""
    found = []
    for path in (run_dir / "parts").glob("status-r*.json"):
        try:
            status = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        named = _STATUS_FILE.match(path.name)
        if named and isinstance(status, dict) and status.get("rank") == int(named.group(1)):
            found.append(status)
    return sorted(found, key=lambda s: s["rank"])


def remove_stale_temps(run_dir: Path) -> None:
    """Remove the temp files a writer killed mid-write left (SIGKILL between writing and renaming): those
    of a rank on this host whose process is gone. Another host's are kept: their writer may live."""
    here = os.uname().nodename
    ours = {s.get("pid") for s in read_rank_statuses(run_dir) if s.get("host") == here}
    for path in [*run_dir.glob(".*.tmp"), *(run_dir / "parts").glob(".*.tmp")]:
        named = TEMP_NAME.match(path.name)
        if named and int(named["pid"]) in ours and not _pid_alive(int(named["pid"])):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise disk_error(exc, "removing", path) from None
