"""The small machinery every config section uses: `Section`, `ConfigError`, building from plain data.

A section is a dataclass with a docstring per field and a `KEY` prefix. Each switch defines its
own section beside its apply (`optimizers/amp.py` holds `AmpConfig`); `optimizers.catalog` derives
`SwitchesConfig`, the `switches.*` part of a run config, from the registry. The first field of every
section is its *primary* field, so `switches.amp=bf16` is shorthand for `switches.amp.dtype=bf16`.

Validation happens in `__post_init__` and raises `ConfigError`, whose message names the full key
(`switches.amp.dtype`) and the allowed values, before any work starts. Nothing here is specific to
the catalog, so `reference_model` and `profiler` build their own sections with it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

MAX_BATCH = 2**16
"""The most samples a micro-batch may hold (train.batch_size, dynamic_batch's bounds): far past any device's
memory at the smallest shapes, and small enough that a plan's shapes stay within 64-bit sizes."""


class ConfigError(ValueError):
    """A config value that is wrong; the message names the key and what is allowed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass
class Section:
    """Base of every config section: knows its key prefix and offers checks that name it."""

    KEY: ClassVar[str] = ""

    def key(self, name: str) -> str:
        return f"{self.KEY}.{name}" if self.KEY else name

    def check_choice(self, name: str, allowed: Iterable[str]) -> None:
        allowed = list(allowed)
        value = getattr(self, name)
        if value not in allowed:
            raise ConfigError(self.key(name), f"got {value!r}; allowed: {', '.join(map(str, allowed))}")

    def check_range(self, name: str, *, lo: float | None = None, hi: float | None = None,
                    lo_open: bool = False, hi_open: bool = False) -> None:
        value = getattr(self, name)
        if value is not None:
            check_number(self.key(name), value, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open)


def check_number(key: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False, hi_open: bool = False) -> None:
    """Refuse anything but a finite number in [lo, hi] (open where asked).

    NaN passes every comparison, and an infinity every missing bound, so both are refused by name: a
    NaN learning rate or flush interval would otherwise reach the run and fail (or spin) there."""
    number = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value))
    bad = not number or (
        lo is not None and (value <= lo if lo_open else value < lo)) or (
        hi is not None and (value >= hi if hi_open else value > hi))
    if not bad:
        return
    if lo is not None and hi is not None:
        span = f" in {'(' if lo_open else '['}{_bound(lo)}, {_bound(hi)}{')' if hi_open else ']'}"
    elif lo is not None:
        span = f" {'>' if lo_open else '>='} {_bound(lo)}"
    elif hi is not None:
        span = f" {'<' if hi_open else '<='} {_bound(hi)}"
    else:
        span = ""
    raise ConfigError(key, f"got {_short(value)}; allowed: a finite number{span}")


def _bound(x: float) -> str:
    """A bound as a user types it: integers whole (1000000000, not 1e+09), other numbers short."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _primary_field(cls: type) -> str:
    return dataclasses.fields(cls)[0].name


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Coerce a YAML/CLI scalar to the field's annotated type, or say what was expected."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or (origin is not None and type(None) in args):
        if value is None or value == "none" and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if origin in (list, tuple):
        items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) \
            else [value]
        return [_coerce(key, v, args[0]) if args else v for v in items]
    try:
        if isinstance(value, (Mapping, list, tuple, set)):  # a YAML collection where one value belongs
            raise TypeError(value)
        if annotation is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes", "on"):
                    return True
                if value.lower() in ("false", "0", "no", "off"):
                    return False
                raise ValueError(value)
            if value not in (True, False):  # 0 and 1 are booleans too (YAML and --set); 2 is not
                raise ValueError(value)
            return bool(value)
        if annotation in (int, float) and isinstance(value, bool):
            raise ValueError(value)  # bool is an int in Python: `steps=true` is a mistake, not 1
        if annotation is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if annotation is float:
            return float(value)
        if annotation is str:
            if isinstance(value, bool):  # YAML 1.1 reads a bare `off` as False
                return "on" if value else "off"
            return str(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(key, f"got {_short(value)}; expected {getattr(annotation, '__name__', annotation)}") from None
    return value


def _short(value: Any, limit: int = 80) -> str:
    """A value's repr cut to one short line, for an error message about a wrong type."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4300-digit limit for str()
        text = f"an integer of {value.bit_length()} bits"
    return text if len(text) <= limit else f"{text[:limit]}..."


def build_section(cls: type, data: Any, key: str) -> Any:
    """Build section `cls` from a mapping (or a scalar for its primary field), validating each key."""
    if dataclasses.is_dataclass(data) and isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        data = {_primary_field(cls): data}
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name not in known:
            raise ConfigError(f"{key}.{name}" if key else name,
                              f"unknown key; allowed: {', '.join(known)}")
        sub_key = f"{key}.{name}" if key else name
        annotation = hints[name]
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            kwargs[name] = build_section(annotation, value, sub_key)
        else:
            kwargs[name] = _coerce(sub_key, value, annotation)
    return cls(**kwargs)


def section_to_dict(obj: Any) -> dict[str, Any]:
    """A section (nested) as plain data, for run.json and YAML."""
    return dataclasses.asdict(obj)

