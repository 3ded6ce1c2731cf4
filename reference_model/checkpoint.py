"""Training checkpoints: atomic saves, keep-last-K, and loads that trust nothing (000 ch.5; 004 4.4).

A save writes `ckpt-<step>.pt.tmp`, fsyncs it and renames it into place, so a crash mid-save leaves
no file under a checkpoint name. A checkpoint that is still damaged (a disk that lied, a copy cut
short) fails `torch.load` and the next older one is used instead. Loads use `weights_only=True`:
a checkpoint is data, never code.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("glmperf.checkpoint")
_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete-looking checkpoint, oldest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], *, keep: int) -> Path:
    """Write `state` for `step` atomically, then delete all but the newest `keep` checkpoints."""
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step)
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    for _, old in list_checkpoints(directory)[:-keep]:
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
