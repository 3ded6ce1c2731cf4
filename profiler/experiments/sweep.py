"""Sweeps: a grid of config settings run as one plan of cells, read as an ablation and a Pareto front.

A sweep is the product of its grid's values (`--grid section.key=v1,v2`), each combination a cell
built with `load_config` first, so the catalog's own checks refuse what cannot run here before
anything starts. Cells run in this process (`profiler.experiments.batch`) with repeats interleaved (every cell
once, then every cell again) so a drift of the machine's speed spreads over all cells alike. The
record, `<runs_dir>/sweeps/<id>/sweep.json` (docs/run-format.md, "Sweeps"), is rewritten after
every run, so an interrupt keeps what is done; the same sweep started again runs only the repeats
without a completed run.

The statistics, on a run's tokens/s and peak memory (the metric registry's figures):

- A cell's `median`, `low`, `high`: median, min and max over its completed repeats.
- Ablation: a key's main effect at one value is the geometric mean of the paired ratios against the
  key's reference (its first grid value), pairs being the same repeat of two cells that differ in
  that key only; the interval is Student's t at CONFIDENCE over the pairs' log-ratios (none from
  one pair).
- Interactions: for two keys, the log of the ratio of one key's effect with the other at a value
  to the same effect with the other at its reference (the 2x2 contrast), per repeat and level of
  the remaining keys; reported when its t interval excludes no change, which needs two contrasts
  at least (a 2x2 grid: --repeats 2).
- Pareto front: the done cells no other done cell beats on both median tokens/s (higher) and
  median peak memory (lower); the fastest and the leanest are always on it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from optimizers.config import ConfigError
from profiler.analysis import load_run, summary_of
from profiler.config import RunConfig, load_config, merge_into
from profiler.experiments import records
from profiler.experiments.batch import Cell, run_cells, traced_once
from profiler.metrics import METRIC_BY_NAME
from profiler.settings import parse_override, settings_text, value_text

KIND = "sweep"
METRICS = {"tokens_per_s": "tokens_per_s", "peak_memory_gib": "peak_memory"}
"""The record's metric names -> the metric registry's (tokens/s; peak memory in GiB)."""
CONFIDENCE = 0.95
_YAML11_WORDS = ("off", "on", "yes", "no")


class SweepError(ValueError):
    """A sweep that cannot start (a malformed grid, nothing left to run); the message is one line."""


def _split(raw: str) -> list[str]:
    """Values at top-level commas: `[2, 1, 3],[1, 1, 2]` is two lists."""
    parts, depth, current = [], 0, ""
    for ch in raw:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [*parts, current]


def _overlap(a: str, b: str) -> bool:
    """One field path is the other or holds it."""
    return a == b or a.startswith(f"{b}.") or b.startswith(f"{a}.")


def check_axes(grid: dict[str, list[Any]]) -> None:
    """Refuse two axes that set one field (the same key by two names, or a section and a field in it):
    the later would override the earlier in some cells, whose labels would then lie."""
    fields = {key: {f for v in values for f in records.fields_set(key, v)} for key, values in grid.items()}
    for a, b in itertools.combinations(grid, 2):
        shared = sorted({x if len(x) >= len(y) else y for x in fields[a] for y in fields[b] if _overlap(x, y)})
        if shared:
            raise SweepError(f"--grid {a} and --grid {b} both set {', '.join(shared)}: a cell's label would not be "
                             "what it trains; allowed: one --grid per field")


def parse_grid(texts: Sequence[str]) -> dict[str, list[Any]]:
    """`section.key=v1,v2` per axis, each value read as `--set` reads it; YAML 1.1's off/on/yes/no
    stay the words typed (the config coerces both forms alike, and the record reads as typed)."""
    grid: dict[str, list[Any]] = {}
    for text in texts:
        key, _, raw = text.partition("=")
        key = key.strip()
        words = [w.strip() for w in _split(raw)]
        if not key or not raw.strip() or "" in words:
            raise SweepError(f"--grid {text!r}: expected section.key=v1,v2 (e.g. switches.amp=off,bf16)")
        if key in grid:
            raise SweepError(f"--grid {key}: given twice; list all its values in one --grid")
        values = [w if w.lower() in _YAML11_WORDS else parse_override(f"{key}={w}")[1] for w in words]
        if len(values) < 2 or any(values.index(v) != i for i, v in enumerate(values)):
            raise SweepError(f"--grid {text!r}: needs at least 2 distinct values")
        try:
            merge_into({}, {key: values[0]})  # the key's path only: values are the cells' to check
        except ConfigError as exc:
            raise SweepError(f"--grid {key}: {exc}") from None
        grid[key] = values
    if not grid:
        raise SweepError("no --grid given: name at least one section.key=v1,v2")
    check_axes(grid)
    return grid


@dataclass(frozen=True)
class Spec:
    """What a sweep is: two commands with equal specs are the same sweep (and resume each other)."""

    preset: str | None
    config: str | None
    grid: dict[str, list[Any]]
    overrides: list[str]
    repeats: int
    steps: int | None
    """train.steps of every cell; None: the config's."""

    def cell_config(self, settings: dict[str, Any]) -> RunConfig:
        steps = [] if self.steps is None else [f"train.steps={self.steps}"]
        sets = [f"{k}={value_text(v)}" for k, v in settings.items()]
        return load_config(config=Path(self.config) if self.config else None, preset=self.preset,
                           overrides=[*self.overrides, *steps, *sets])


def expand(spec: Spec) -> tuple[list[tuple[dict[str, Any], RunConfig]], list[dict[str, Any]]]:
    """Every combination of the grid (first key slowest) built, or refused with the catalog's reason."""
    accepted: list[tuple[dict[str, Any], RunConfig]] = []
    refused: list[dict[str, Any]] = []
    for combo in itertools.product(*spec.grid.values()):
        settings = dict(zip(spec.grid, combo, strict=True))
        try:
            accepted.append((settings, spec.cell_config(settings)))
        except ConfigError as exc:
            refused.append({"settings": settings, "reason": str(exc)})
    if not accepted:
        reasons = "; ".join(dict.fromkeys(r["reason"] for r in refused))
        raise SweepError(f"every one of the {len(refused)} cells of the grid is refused: {reasons}")
    check_cells(accepted)
    return accepted, refused


def check_cells(cells: Sequence[tuple[dict[str, Any], RunConfig]]) -> None:
    """Refuse a grid two of whose cells train the same config (two values that mean the same, e.g.
    `off` and `false`): their labels differ, what they measure does not, and the ablation would report
    noise as an effect."""
    seen: dict[str, dict[str, Any]] = {}
    for settings, cfg in cells:
        resolved = json.dumps({k: v for k, v in cfg.to_dict().items() if k != "name"}, sort_keys=True, default=str)
        if resolved in seen:
            raise SweepError(f"cells {settings_text(seen[resolved])} and {settings_text(settings)} resolve to the "
                             "same config; allowed: grid values that train differently")
        seen[resolved] = settings


def _same(a: Any, b: Any) -> bool:
    """Equal, the grid's order included (it numbers the cells)."""
    return json.dumps(a, default=str) == json.dumps(b, default=str)


def new_record(spec: Spec, accepted: Sequence[tuple[dict[str, Any], RunConfig]],
               refused: list[dict[str, Any]]) -> dict[str, Any]:
    steps = spec.steps if spec.steps is not None else accepted[0][1].train.steps
    cells: list[dict[str, Any]] = [{"index": i, "settings": s, "runs": [], "attempts": [], "status": "pending",
                                    "tokens_per_s": None, "peak_memory_gib": None} for i, (s, _) in enumerate(accepted)]
    record = {"status": "running", "spec": {**asdict(spec), "steps": steps}, "cells": cells, "refused": refused}
    return refresh(record)


def same_sweeps(runs_dir: Path, record: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """The stored sweeps with this record's spec and cells, newest first."""
    cells = [c["settings"] for c in record["cells"]]
    return [(d, old) for d, old in records.list_all(runs_dir, KIND)
            if _same(old.get("spec"), record["spec"]) and _same([c["settings"] for c in old.get("cells", [])], cells)]


def completed(cell: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The cell's completed attempt per repeat."""
    return {a["repeat"]: a for a in cell["attempts"] if a["status"] == "completed"}


def todo(record: dict[str, Any]) -> list[tuple[int, int]]:
    """(cell, repeat) without a completed run, repeats interleaved: every cell once, then again."""
    done = [completed(c) for c in record["cells"]]
    return [(i, r) for r in range(record["spec"]["repeats"]) for i in range(len(done)) if r not in done[i]]


def measure(run_dir: Path) -> dict[str, Any]:
    """A run's status and its figures in the record's units."""
    run = load_run(run_dir)
    summary = summary_of(run)
    figures = {name: METRIC_BY_NAME[m].value(summary) for name, m in METRICS.items()}
    return {"run": run.id, "status": run.status,
            **{name: v if math.isfinite(v) else None for name, v in figures.items()}}  # JSON has no NaN


def _spread(values: list[float]) -> dict[str, float] | None:
    return {"median": float(np.median(values)), "low": min(values), "high": max(values)} if values else None


def _pct(log_ratio: float) -> float:
    return 100.0 * math.expm1(log_ratio)


def _interval(logs: list[float]) -> dict[str, Any]:
    """Mean log-ratio as a change in %, with its Student t interval (None from fewer than 2)."""
    x = np.asarray(logs)
    mean, low, high = float(x.mean()), None, None
    if len(x) > 1:
        half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
        low, high = _pct(mean - half), _pct(mean + half)
    return {"change_pct": _pct(mean), "low_pct": low, "high_pct": high, "pairs": len(x)}


Table = dict[tuple[int, ...], dict[int, dict[str, Any]]]
"""Grid levels (each key's value position) -> a cell's completed attempts by repeat."""


def _table(record: dict[str, Any]) -> Table:
    grid = record["spec"]["grid"]
    return {tuple(grid[k].index(c["settings"][k]) for k in grid): completed(c) for c in record["cells"]}


def _logs(table: Table, metric: str, signs: Sequence[tuple[tuple[int, ...], float]]) -> list[float]:
    """sum(sign * log figure) over the given cells, once per repeat that all of them completed."""
    runs = [r for levels, _ in signs if (r := table.get(levels)) is not None]
    if len(runs) < len(signs):
        return []
    out = []
    for rep in sorted(set.intersection(*(set(r) for r in runs))):
        figures = [r[rep][metric] for r in runs]
        if all(f is not None and f > 0 for f in figures):
            out.append(sum(s * math.log(f) for f, (_, s) in zip(figures, signs, strict=True)))
    return out


def _at(levels: tuple[int, ...], at: dict[int, int]) -> tuple[int, ...]:
    """`levels` with the positions in `at` set to those levels."""
    return tuple(at.get(i, v) for i, v in enumerate(levels))


def _effect(table: Table, metric: str, p: int, a: int, fixed: dict[int, int]) -> list[float]:
    """Log-ratios of key p at level a against its reference, over the cells at the `fixed` levels."""
    return [x for lv in table if lv[p] == a and all(lv[i] == v for i, v in fixed.items())
            for x in _logs(table, metric, [(lv, 1.0), (_at(lv, {p: 0}), -1.0)])]


def ablation(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each key's main effect at each non-reference value, per metric (see the module docstring)."""
    grid, table = record["spec"]["grid"], _table(record)
    rows = []
    for p, (key, values) in enumerate(grid.items()):
        for a, value in enumerate(values[1:], start=1):
            for metric in METRICS:
                logs = _effect(table, metric, p, a, {})
                if logs:
                    rows.append({"key": key, "value": value, "reference": values[0], "metric": metric,
                                 **_interval(logs)})
    return rows


def interactions(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Pairs of keys whose 2x2 contrast's interval excludes no change (see the module docstring)."""
    grid, table = record["spec"]["grid"], _table(record)
    keys = list(grid)
    rows = []
    for (p, kp), (q, kq) in itertools.combinations(enumerate(keys), 2):
        for a, b in itertools.product(range(1, len(grid[kp])), range(1, len(grid[kq]))):
            for metric in METRICS:
                logs = [x for lv in table if lv[p] == 0 and lv[q] == 0 for x in _logs(table, metric, [
                    (_at(lv, {p: a, q: b}), 1.0), (_at(lv, {q: b}), -1.0), (_at(lv, {p: a}), -1.0), (lv, 1.0)])]
                found = _interval(logs) if len(logs) > 1 else None
                if found is None or found["low_pct"] <= 0 <= found["high_pct"]:
                    continue
                at = [f"{_pct(float(np.mean(_effect(table, metric, p, a, {q: lq})))):+.1f}% with "
                      f"{kq}={value_text(grid[kq][lq])}" for lq in (0, b)]
                note = (f"{kp}={value_text(grid[kp][a])} changes {METRIC_BY_NAME[METRICS[metric]].label} by "
                        f"{at[0]} but by {at[1]}")
                rows.append({"keys": [kp, kq], "values": [grid[kp][a], grid[kq][b]], "metric": metric,
                             **found, "note": note})
    return rows


def pareto(record: dict[str, Any]) -> list[int]:
    """Indices of the done cells no other done cell beats on both tokens/s and peak memory, leanest first."""
    points = [(c["index"], c["tokens_per_s"]["median"], c["peak_memory_gib"]["median"]) for c in record["cells"]
              if c["status"] == "done" and all(c[m] is not None for m in METRICS)]
    front = [i for i, tps, mem in points
             if not any(t >= tps and m <= mem and (t > tps or m < mem) for _, t, m in points)]
    return sorted(front, key=lambda i: record["cells"][i]["peak_memory_gib"]["median"])


def refresh(record: dict[str, Any]) -> dict[str, Any]:
    """Recompute every derived field (cells' figures and status, ablation, interactions, front)."""
    repeats = record["spec"]["repeats"]
    for cell in record["cells"]:
        done = completed(cell)
        for metric in METRICS:
            cell[metric] = _spread([a[metric] for a in done.values() if a[metric] is not None])
        failed = any(a["status"] == "failed" and a["repeat"] not in done for a in cell["attempts"])
        cell["status"] = "done" if len(done) == repeats else "failed" if failed else "pending"
    record.update(ablation=ablation(record), interactions=interactions(record))
    record["pareto"] = pareto(record)
    return record


def run_sweep(record_dir: Path, record: dict[str, Any], configs: Sequence[RunConfig], *, runs_dir: Path,
              progress: bool = True) -> dict[str, Any]:
    """Run the record's repeats without a completed run, rewriting the record after each; Ctrl-C
    leaves it `interrupted` with everything done so far."""
    cells = [Cell(f"{settings_text(record['cells'][i]['settings'])} (repeat {r + 1}/{record['spec']['repeats']})",
                  traced_once(configs[i], r), links={KIND: {"id": record["id"], "cell": i, "repeat": r}})
             for i, r in todo(record)]
    record["status"] = "running"
    records.write(record_dir, KIND, record)
    try:
        for cell, run_dir in run_cells(cells, runs_dir=runs_dir, progress=progress):
            link = cell.links[KIND]
            entry = record["cells"][link["cell"]]
            entry["runs"].append(run_dir.name)
            entry["attempts"].append({"repeat": link["repeat"], **measure(run_dir)})
            records.write(record_dir, KIND, refresh(record))
        record["status"] = "completed"
    except KeyboardInterrupt:
        record["status"] = "interrupted"
    records.write(record_dir, KIND, refresh(record))
    return record
