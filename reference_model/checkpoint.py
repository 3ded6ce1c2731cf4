"""Training checkpoints: atomic saves, keep-last-K, and loads that trust nothing (000 ch.5; 004 4.4).

A save writes `ckpt-<step>.pt.<pid>.tmp`, fsyncs it and renames it into place, so a crash mid-save
leaves no file under a checkpoint name. A checkpoint that is still damaged (a disk that lied, a copy
cut short) fails `torch.load` and the next older one is used instead. Loads use `weights_only=True`:
a checkpoint is data, never code.

Keep-last-K counts only what could be resumed on this run's way: well-named, complete (torch.save's
zip archive whole, its end record in place) and not past the step just saved (a later step is another
timeline's: a run resumed from an older checkpoint, or another run in a shared directory). The one just
saved is never deleted, and nothing it did not count (temp files, damaged or foreign checkpoints) is.
"""

from __future__ import annotations

import logging
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("glmperf.checkpoint")
_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every well-named checkpoint file, oldest first (whether it loads is for the loader)."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_file()]
    return sorted(found)


def is_complete(path: Path) -> bool:
    """Whether `path` is a whole torch.save archive: a zip whose end record is in place (a file cut short
    or overwritten is not), read without loading it."""
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], *, keep: int) -> Path:
    """Write `state` for `step` atomically, then delete the oldest complete checkpoints up to `step` beyond
    the newest `keep` of them (never the one just written)."""
    if keep < 1:
        raise ValueError(f"keep: got {keep}; allowed: an integer >= 1")
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step)
    tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    counted = [path for s, path in list_checkpoints(directory) if s < step and is_complete(path)]
    for old in counted[:max(0, len(counted) - (keep - 1))]:
        old.unlink(missing_ok=True)
    return final


def load_latest(directory: Path, *, map_location: str | torch.device = "cpu"
                ) -> tuple[int, dict[str, Any], Path] | None:
    """The newest checkpoint that loads, as (step, state, path); damaged ones are skipped with a warning."""
    for step, path in reversed(list_checkpoints(directory)):
        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as exc:  # a truncated or corrupt file: fall back to the previous one
            log.warning("checkpoint %s is unreadable (%s: %s); trying an older one",
                        path, type(exc).__name__, exc)
            continue
        return step, state, path
    return None
