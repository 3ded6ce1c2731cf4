"""Files written whole or not at all, and the store's one error.

Every file the store writes goes through `atomic_write`: a temp file beside the target, renamed into
place. A reader sees the old file or the new one, never part of one, and whatever stops the write (a
full disk, Ctrl-C, any exception) removes the temp file before it goes on up.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


class StoreError(ValueError):
    """A run directory or runs directory that cannot be used; the message says what is wrong."""


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def disk_error(exc: OSError, doing: str, path: Path | str | None = None) -> StoreError:
    """An OS error as one line: `no space left on device writing <path>`."""
    why = exc.strerror or errno.errorcode.get(exc.errno or 0) or str(exc)
    return StoreError(f"{why[:1].lower()}{why[1:]} {doing} {path or exc.filename or ''}".rstrip())


TEMP_NAME = re.compile(r"^\..+\.(?P<pid>\d+)\.[0-9a-f]+\.tmp$")
"""The temp file `atomic_write` writes before renaming it: `.<name>.<writer's pid>.<hex>.tmp`."""


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)`, then rename tmp to `path`; on any failure the temp file is removed, and an OS error
    (a full disk) becomes a StoreError naming `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")  # TEMP_NAME reads it
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise disk_error(exc, "writing", path) from None
        raise


def plain(x: Any) -> Any:
    """Strict-JSON-safe: NaN and infinities as null (bare NaN is no JSON other parsers read), tuples as
    lists. Every JSON glmperf prints or writes goes through it (`json_text`)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def json_text(data: Any) -> str:
    """`data` as strict JSON (RFC 8259), indented; `allow_nan=False` makes a value `plain` missed fail
    loudly instead of printing a bare NaN."""
    return json.dumps(plain(data), indent=2, default=str, allow_nan=False)


def write_json_atomic(path: Path, data: Any) -> None:
    """The store's own records (run.json, rank status, records), strict JSON like everything glmperf writes
    (`json_text`): a figure not measured is null there, which the readers take as NaN (`num`)."""
    text = json_text(data)
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
