"""The records of experiments beside the runs they made: `<runs_dir>/sweeps/<id>/sweep.json`,
`<runs_dir>/tunes/<id>/tune.json`, rewritten as the experiment goes, so an interrupted one keeps
what is done, and a finished tune's `tuned.yaml`. Their runs are ordinary runs in `<runs_dir>`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from profiler import store
from profiler.config import merge_into
from profiler.metrics import flatten
from profiler.settings import settings_text
from profiler.store import plain

KINDS = {"sweep": "sweeps", "tune": "tunes"}
"""Records of experiments (a sweep's grid, a tune's steps) live beside the runs:
`<runs_dir>/<sweeps|tunes>/<id>/<kind>.json`; their runs are ordinary runs in `<runs_dir>`."""


def fields_set(key: str, value: Any) -> list[str]:
    """The config fields `key=value` sets, by their full names: a switch's shorthand `switches.amp=bf16`
    sets `switches.amp.dtype`; `model.preset` sets every model field (named `model`)."""
    if key == "model.preset":
        return ["model"]
    data: dict[str, Any] = {}
    merge_into(data, {key: value})
    return list(flatten(data))


def canonical(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A change of settings by the full names of the fields it sets (`switches.amp=bf16` and
    `switches.amp.dtype=bf16` are one change), in a stable order: what makes two changes the same."""
    data: dict[str, Any] = {}
    merge_into(data, dict(settings))
    return dict(sorted(flatten(data).items()))


def create(runs_dir: Path, kind: str, name: str, record: dict[str, Any]) -> Path:
    """A new record directory with its record (`id`, `created` added); returns the directory."""
    record_dir = store.new_dir(runs_dir / KINDS[kind], name)
    write(record_dir, kind, {"schema_version": store.SCHEMA_VERSION, "id": record_dir.name, "created": store.utc_now(),
                                **record})
    return record_dir


def write(record_dir: Path, kind: str, record: dict[str, Any]) -> None:
    """The record as strict JSON: a figure that is NaN (a failed cell's) is written null."""
    store.write_json_atomic(record_dir / f"{kind}.json", plain(record))


def read(record_dir: Path, kind: str) -> dict[str, Any]:
    path = record_dir / f"{kind}.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise store.StoreError(f"{record_dir} is not a {kind} directory (no {kind}.json)") from None
    except OSError as exc:
        raise store.StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise store.StoreError(f"{path} is not valid JSON (truncated or damaged: {exc})") from None
    if not isinstance(record, dict):
        raise store.StoreError(f"{path} holds no {kind} record")
    return record


def list_all(runs_dir: Path, kind: str) -> list[tuple[Path, dict[str, Any]]]:
    """Every readable record of `kind`, newest first (unreadable ones are skipped)."""
    out = []
    for path in (runs_dir / KINDS[kind]).glob(f"*/{kind}.json"):
        try:
            out.append((path.parent, read(path.parent, kind)))
        except store.StoreError:
            continue
    return sorted(out, key=lambda p: p[1].get("created") or "", reverse=True)


def resolve(ref: str | Path, runs_dir: Path, kind: str) -> Path:
    """A record directory from what a user typed: its directory, its record file, or its id."""
    path = Path(ref)
    if path.is_file() and path.name == f"{kind}.json":
        return path.parent
    for candidate in (path, runs_dir / KINDS[kind] / str(ref)):
        if (candidate / f"{kind}.json").exists():
            return candidate
    raise store.StoreError(f"no {kind} {str(ref)!r}: not a {kind} directory, nor a {kind} id in "
                     f"{runs_dir / KINDS[kind]}")


def tuned_yaml(record: Mapping[str, Any]) -> str:
    """The tuned config as `profile-run --config` takes it, headed by what was adopted and why."""
    lines = ["# Tuned by glmperf tune (record: tune.json beside this file).",
             f"# Stopped: {record.get('stopped')}."]
    for entry in record["rounds"]:
        change = settings_text(entry["tried"])
        lines.append(f"# round {entry['round']}: {change}: {entry['decision']} ({entry['why']})")
    if not record["adopted"]:
        lines.append("# Nothing was adopted: this is the starting config.")
    return "\n".join(lines) + "\n" + yaml.safe_dump(record["tuned"]["config"], sort_keys=False)


def write_tuned(record: Mapping[str, Any], record_dir: Path, output: Path | None) -> Path:
    path = output or record_dir / "tuned.yaml"
    path.write_text(tuned_yaml(record), encoding="utf-8")
    return path
