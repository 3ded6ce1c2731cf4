"""Figures: named, measured numbers with their unit and where they come from.

Every analyzer returns a `dict[str, Figure]`; a diagnosis rule cites figures as its evidence, so
each one says where a reader finds it again (`summary.phase_share.data`, `ops.parquet`,
`environment.cpu_flags`, ...). Percentages are stored as percent, sizes in GiB or MiB, times in ms.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One measured number: its value in `unit`, and the stored figure or table it comes from."""

    value: float
    unit: str
    source: str
    label: str = ""
    """What the number counts where its unit cannot say (a straggler's rank: the calls it is last at)."""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "label" or v}


Figures = dict[str, Figure]


def stored(figures: Figures) -> dict[str, dict[str, Any]]:
    """The figures as run.json's diagnosis and `glmperf diagnose --json` hold them."""
    return {name: f.as_dict() for name, f in figures.items()}


def num(value: Any) -> float:
    """A stored value as a float; NaN for None, missing or non-numbers."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def known(figures: Figures, *names: str) -> bool:
    """True when every named figure is present and a number."""
    return all(n in figures and not math.isnan(figures[n].value) for n in names)
