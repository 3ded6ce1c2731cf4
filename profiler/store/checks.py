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
_OBJECTS = (list, "a list of objects")
Spec = dict[str, tuple[type, str]]
FIELD_TYPES: Spec = {
    "id": _TEXT, "name": _TEXT, "created": _TEXT, "ended": _TEXT, "host": _TEXT, "error": _TEXT, "source": _TEXT,
    "pid": _INTEGER, "world_size": _INTEGER, "events_skipped": _INTEGER, "config": _OBJECT, "environment": _OBJECT,
    "summary": _OBJECT, "diagnosis": _OBJECT, "peak": _OBJECT, "matmul_peaks": _OBJECT, "shape_speedup": _OBJECT,
    "model": _OBJECT, "sampling": _OBJECT, "verifies": _OBJECT, "sweep": _OBJECT, "tune": _OBJECT, "import": _OBJECT,
    "ranks": _OBJECTS, "attempts": _OBJECTS, "preset_changes": _LIST, "switches_applied": _LIST, "setup_notes": _LIST,
}
"""run.json's fields readers rely on, with their type; each may also be null (not known)."""
NESTED_TYPES: dict[str, Spec] = {
    "config": {section: _OBJECT for section in ("model", "data", "train", "switches", "profile", "user")},
    "summary": {**{section: _OBJECT for section in ("step_time_s", "phase_share", "comm", "io", "straggler", "trace")},
                "notes": _LIST},
    "diagnosis": {"verdict": _TEXT, "bottlenecks": _OBJECTS, "recommendations": _OBJECTS, "skipped": _OBJECTS,
                  "figures": _OBJECT, "verification": _OBJECT},
}
"""The sections inside run.json's objects that readers walk into, as FIELD_TYPES for the record."""


class NewerSchema(StoreError):
    """A run written by a newer glmperf: readable by that one, not this one."""


_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true or false"}


def said(value: Any) -> str:
    """`value` and its JSON kind, for a message: `'1234', a string`."""
    return f"{value!r:.60}, {_JSON_NAMES.get(type(value), type(value).__name__)}"


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def check_record(path: Path, record: Any) -> dict[str, Any]:
    """`record` as read from `path` when glmperf can read it; else a StoreError naming the file and the field."""
    if not isinstance(record, dict):
        raise StoreError(f"{path} is not a run record (a JSON {type(record).__name__}, not an object)")
    version = record.get("schema_version", 1)
    if not _is(version, int) or version < 1:
        raise StoreError(f"{path}: schema_version is {said(version)}; allowed: an integer from 1")
    if version > SCHEMA_VERSION:
        run = record.get("id") if isinstance(record.get("id"), str) else path.parent.name
        raise NewerSchema(f"run {run} was written by a newer glmperf (schema {version}; this one reads up to "
                          f"{SCHEMA_VERSION}): upgrade glmperf")
    if record.get("status") not in STATUSES:
        raise StoreError(f"{path} is not a run record: status is {record.get('status')!r}; "
                         f"allowed: {', '.join(STATUSES)}")
    _check_fields(path, record, FIELD_TYPES)
    for key, spec in NESTED_TYPES.items():
        _check_fields(path, record.get(key) or {}, spec, f"{key}.")
    return record


def _check_fields(path: Path, fields: dict[str, Any], spec: Spec, prefix: str = "") -> None:
    for key, (kind, allowed) in spec.items():
        value = fields.get(key)
        if value is not None and not _is(value, kind):
            raise StoreError(f"{path}: {prefix}{key} is {said(value)}; allowed: {allowed} or null")
        if allowed == _OBJECTS[1] and value and (item := next((i for i in value if not isinstance(i, dict)), None)):
            raise StoreError(f"{path}: {prefix}{key} holds {said(item)}; allowed: {allowed} or null")
