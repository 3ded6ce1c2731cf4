"""Paths the reports and the dashboard write or serve, checked before they are used.

What a run stores (its id, its name, a trace's file name) is data, never a path: `plain_name` reduces it
to one plain file name. A report is written over a regular file or at a new path, never through a
symbolic link or over a device, fifo or directory (`check_output`). A run or sweep directory is
written into, and a run is served by the dashboard, only when it lies inside the runs directory and
is no symbolic link (`inside`, `served_run`).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from profiler import store

NAME_LIMIT = 80
"""Longest file name `plain_name` makes: far under any file system's 255 bytes, with room for a suffix."""
UNNAMED = "unnamed"


class Refused(ValueError):
    """A path the reports or the dashboard will not write to or serve; the message says why and what is
    allowed."""


def plain_name(stored: str, limit: int = NAME_LIMIT) -> str:
    """One file name component from a stored string: ASCII letters, digits, `.`, `_` and `-` only (any
    other run of characters, separators included, becomes one `-`), no `..`, no leading dot or dash
    (no hidden file, no option), at most `limit` characters; UNNAMED when nothing is left."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stored)
    name = re.sub(r"\.{2,}", ".", name).lstrip(".-")[:limit]
    return name or UNNAMED


def inside(path: Path, root: Path) -> bool:
    """Whether `path` is no symbolic link and lies inside `root` once every link on the way is resolved."""
    return not path.is_symlink() and path.resolve().is_relative_to(root.resolve())


def check_output(path: Path) -> None:
    """Refuse, before any work, a report output that exists and is not a regular file: a symbolic link
    (write to its target by naming it), a device, a fifo, a directory."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise Refused(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode):
        raise Refused(f"will not write through {path}: it is a symbolic link (to {os.readlink(path)}); "
                      "allowed: a regular file or a new path (name the link's target to write there)")
    if not stat.S_ISREG(mode):
        raise Refused(f"will not write {path}: it exists and is not a regular file; allowed: a regular file or "
                      "a new path")


def check_inside(directory: Path, runs_dir: Path, what: str) -> None:
    """Refuse to write into a run or sweep directory that is a symbolic link or lies outside the runs
    directory (a link there could point anywhere); `-o FILE` writes elsewhere."""
    if not inside(directory, runs_dir):
        raise Refused(f"will not write into {what} {directory}: it is a symbolic link or lies outside the runs "
                      f"directory {runs_dir}; give -o FILE to write the report elsewhere (or --runs-dir DIR for "
                      "the runs directory it lies in)")


def served_run(ref: str, runs_dir: Path) -> Path:
    """The directory of the run `ref` names (its id, its name, or a path to it) when that run lies inside
    the runs directory; StoreError with the same line for anything else, there or not."""
    try:
        path = store.resolve_run(ref, runs_dir)
        served = inside(path, runs_dir) and inside(path / "run.json", runs_dir) and (path / "run.json").is_file()
    except (store.StoreError, OSError, ValueError):  # a name too long for a path, a NUL in it
        served = False
    if not served:
        raise store.StoreError(f"no run {ref!r} in this runs directory (the Runs page lists them)")
    return path
