"""What the report tests share: a reader of report pages, plotly's packed arrays, and a sweep record
over real runs (no tests here)."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np

XSS = "<script>alert(1)</script>"


def values(data: Any) -> list[Any]:
    """A figure's data array as a list: plotly packs numeric arrays as {"dtype", "bdata"} (base64)."""
    if isinstance(data, dict) and "bdata" in data:
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=np.dtype(data["dtype"])).tolist()
    return list(data)


def summary_of_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())["summary"]


class Page(HTMLParser):
    """The parts of a report page the tests read: headings, sections with their plots and specs,
    every script element with its type, and the table rows as cell texts."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.headings: list[tuple[str, str]] = []
        self.sections: dict[str, dict[str, Any]] = {}
        self.scripts: list[tuple[str, str]] = []
        self.rows: list[list[str]] = []
        self._tag: str | None = None
        self._section: str | None = None
        self._script: str | None = None
        self._text = ""
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section" and "figure" in (a.get("class") or ""):
            self._section = a["id"]
            self.sections[self._section] = {"plots": 0, "specs": []}
        if tag == "div" and a.get("class") == "plot" and self._section:
            self.sections[self._section]["plots"] += 1
        if tag == "script":
            self._script = a.get("type") or "text/javascript"
            self._text = ""
        if tag in ("h1", "h2", "h3"):
            self._tag, self._text = tag, ""
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._tag, self._text = tag, ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.scripts.append((self._script or "", self._text))
            if self._script == "application/json" and self._section:
                self.sections[self._section]["specs"].append(json.loads(self._text))
            self._script = None
        elif tag in ("h1", "h2", "h3") and self._tag == tag:
            self.headings.append((tag, " ".join(self._text.split())))
            self._tag = None
        elif tag in ("td", "th") and self._tag == tag:
            self.rows[-1].append(" ".join(self._text.split()))
            self._tag = None
        elif tag == "section":
            self._section = None

    def handle_data(self, data: str) -> None:
        if self._script is not None or self._tag is not None:
            self._text += data

    def row(self, first: str) -> list[str]:
        return next(r for r in self.rows if r and r[0] == first)


def write_sweep(root: Path, runs: list[Path], status: str = "completed") -> Path:
    """A sweep record in the shape `glmperf sweep` stores, over real runs, with their figures."""
    cells = []
    for i, run_dir in enumerate(runs):
        s = summary_of_json(run_dir)
        tps, mem = s["tokens_per_s"], s["peak_memory_bytes"] / 2**30
        cells.append({"index": i, "settings": {"train.batch_size": 4 * (i + 1)}, "runs": [run_dir.name],
                      "status": "done", "tokens_per_s": {"median": tps, "low": 0.9 * tps, "high": 1.1 * tps},
                      "peak_memory_gib": {"median": mem, "low": 0.98 * mem, "high": 1.02 * mem}})
    cells.append({"index": len(runs), "settings": {"train.batch_size": 64}, "runs": [], "status": "pending"})
    sweep = {"schema_version": 1, "id": "sweep-1", "created": "2026-01-01T00:00:00+00:00", "status": status,
             "spec": {"preset": "tiny", "grid": {"train.batch_size": [4, 8, 64]}, "overrides": [], "repeats": 1,
                      "steps": 8},
             "cells": cells, "refused": [{"settings": {"train.batch_size": 4096}, "reason": f"too big {XSS}"}],
             "ablation": [{"key": "train.batch_size", "value": 8, "reference": 4, "metric": m, "change_pct": 12.5,
                           "low_pct": 3.0, "high_pct": 20.0, "pairs": 1} for m in ("tokens_per_s", "peak_memory_gib")],
             "interactions": [{"keys": ["train.batch_size", "switches.amp.dtype"], "metric": "tokens_per_s",
                               "change_pct": -4.0, "note": "smaller together"}],
             "pareto": [0, 1]}
    path = root / "sweeps" / "sweep-1" / "sweep.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(sweep))
    return path
