"""What a run.json must be for glmperf to read it: its schema version, and each known field's type.

A record written by a newer glmperf is refused with what to do (upgrade), never read as an old one; a
record with a field of the wrong type (a hand edit, a damaged copy) is refused naming the file and the
field, so no reader ever meets a `pid` that is text or a `summary` that is a list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profiler.store.files import StoreError

SCHEMA_VERSION = 1
STATUSES = ("running", "completed", "failed", "interrupted")
"""The statuses a run.json holds on disk (`incomplete` and `corrupt` are only ever read)."""

_OBJECT, _LIST, _TEXT, _INTEGER = (dict, "an object"), (list, "a list"), (str, "a string"), (int, "an integer")
FIELD_TYPES: dict[str, tuple[type, str]] = {
    "id": _TEXT, "name": _TEXT, "created": _TEXT, "ended": _TEXT, "host": _TEXT, "error": _TEXT, "source": _TEXT,
    "pid": _INTEGER, "world_size": _INTEGER, "events_skipped": _INTEGER, "config": _OBJECT, "environment": _OBJECT,
    "summary": _OBJECT, "diagnosis": _OBJECT, "peak": _OBJECT, "matmul_peaks": _OBJECT, "shape_speedup": _OBJECT,
    "model": _OBJECT, "sampling": _OBJECT, "verifies": _OBJECT, "sweep": _OBJECT, "tune": _OBJECT, "import": _OBJECT,
    "ranks": _LIST, "attempts": _LIST, "preset_changes": _LIST, "switches_applied": _LIST, "setup_notes": _LIST,
}
"""run.json's fields readers rely on, with their type; each may also be null (not known)."""
RECORD_LISTS = ("ranks", "attempts")
"""Fields that are lists of objects (one per rank, one per attempt)."""


class NewerSchema(StoreError):
    """A run written by a newer glmperf: readable by that one, not this one."""


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def check_record(path: Path, record: Any) -> dict[str, Any]:
    """`record` as read from `path` when glmperf can read it; else a StoreError naming the file and the field."""
    if not isinstance(record, dict):
        raise StoreError(f"{path} is not a run record (a JSON {type(record).__name__}, not an object)")
    version = record.get("schema_version", 1)
    if not _is(version, int) or version < 1:
        raise StoreError(f"{path}: schema_version is {version!r}; allowed: an integer from 1")
    if version > SCHEMA_VERSION:
        run = record.get("id") if isinstance(record.get("id"), str) else path.parent.name
        raise NewerSchema(f"run {run} was written by a newer glmperf (schema {version}; this one reads up to "
                          f"{SCHEMA_VERSION}): upgrade glmperf")
    if record.get("status") not in STATUSES:
        raise StoreError(f"{path} is not a run record: status is {record.get('status')!r}; "
                         f"allowed: {', '.join(STATUSES)}")
    for key, (kind, said) in FIELD_TYPES.items():
        value = record.get(key)
        if value is not None and not _is(value, kind):
            raise StoreError(f"{path}: {key} is {value!r:.60} (a {type(value).__name__}); allowed: {said} or null")
    for key in RECORD_LISTS:
        for item in record.get(key) or []:
            if not isinstance(item, dict):
                raise StoreError(f"{path}: {key} is {record[key]!r:.60}, holding a {type(item).__name__}; "
                                 "allowed: a list of objects or null")
    return record
