"""Corpora: the files a run's `data.corpus` names, listed and checked without reading them (so a config is
validated without the loader, or torch)."""

from __future__ import annotations

import functools
import glob
import os
import sysconfig
from pathlib import Path

from optimizers.config import ConfigError

ALLOWED = "allowed: stdlib, synthetic, or text file paths/globs"
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def _walk_files(root: Path, suffix: str | None = None) -> list[Path]:
    """Files under `root`, sorted, skipping hidden entries, __pycache__ and site-packages."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
        found += [Path(dirpath, f) for f in filenames
                  if not f.startswith(".") and (suffix is None or f.endswith(suffix))]
    return sorted(found)


@functools.cache
def _stdlib_files() -> tuple[Path, ...]:
    """This Python's standard library sources, resolved: listed once per process (runs of one plan
    share them; the library does not change under a running interpreter)."""
    return tuple(p.resolve() for p in _walk_files(Path(sysconfig.get_paths()["stdlib"]), ".py"))


def resolve_corpus(names: list[str]) -> list[Path] | None:
    """The files of a corpus, in a fixed order; None for `synthetic` (random tokens, no files).

    `stdlib` is this Python's standard library .py sources (site-packages excluded); any other
    name is a path or glob (`~` expanded; a directory means every file under it, recursively;
    binary files are skipped when read). Only lists and stats, so it is cheap at validation time.
    """
    if "synthetic" in names:
        if len(names) > 1:
            raise ConfigError("data.corpus", f"synthetic cannot be combined with {names}; {ALLOWED}")
        return None
    files: list[Path] = []
    for name in names:
        if name == "stdlib":
            files += _stdlib_files()
            continue
        pattern = os.path.expanduser(name)
        is_glob = any(c in pattern for c in "*?[")
        matches = sorted(glob.glob(pattern, recursive=True)) if is_glob else [pattern]
        hits = []
        for match in map(Path, matches):
            if match.is_dir():
                hits += _walk_files(match)
            elif match.is_file():
                hits.append(match)
        if not hits:
            raise ConfigError("data.corpus", f"{name!r} matches no file; {ALLOWED}")
        files += [p.resolve() for p in hits]
    return list(dict.fromkeys(files))  # dedupe, keep order
