"""The dashboard's data: cached loaders over the runs directory that call `profiler` and `reports` only.

Each loader is keyed on a stamp of the files it reads (the modification times of run.json, the
tables, events.jsonl and the live `parts/` folder), so a running run, whose ranks add part files
every `profile.flush_interval_s`, is read again as it grows, and an unchanged one comes from the
cache. Entries also expire after LIVE_TTL_S: a run whose process was killed changes no file, yet
reads as `incomplete` once its entry is read again.

Nothing here raises for a bad run: what cannot be read comes back as an `error` to show, with the
runs directory's path taken out (`shown`). Only runs inside the runs directory are listed or served
(reports.paths.served_run): a run directory that is a symbolic link is neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from optimizers.config import ConfigError
from profiler import settings, store, text
from profiler.analysis import RunData, RunRecord, load_run, summary_of
from profiler.experiments import records as experiment_records
from profiler.metrics import METRIC_BY_NAME, lookup
from reports import paths, report_run, report_sweep

if TYPE_CHECKING:
    from profiler.compare.runs import Comparison

STAMPED = ("run.json", "steps.parquet", "samples.parquet", "ops.parquet", "events.jsonl", "parts")
LIVE_TTL_S = 30
LIVE = ("running",)
"""Statuses of a run that still writes: its summary is computed from the flushed steps."""
METRIC_COLUMNS = {"tokens/s": "tokens_per_s", "step p50 (ms)": "step_time_p50", "peak memory (GiB)": "peak_memory",
                  "MFU (%)": "mfu"}
Figures = list[tuple[str, go.Figure | None, str]]


def runs_dir() -> Path:
    """The runs directory every page reads: $GLMPERF_RUNS (set by `glmperf dashboard`), else ./runs."""
    return store.default_runs_dir().resolve()


def shown(text: str, runs_dir: Path) -> str:
    """`text` as a page may show it: a path under the runs directory relative to it, the directory itself
    by its name, so no page shows where the server keeps its files."""
    return text.replace(f"{runs_dir}/", "").replace(str(runs_dir), runs_dir.name)


def stamp(run_dir: Path) -> tuple[int, ...]:
    """What changes when a run's files change: their modification times (0 for a file not there)."""
    out = []
    for name in STAMPED:
        try:
            out.append((run_dir / name).stat().st_mtime_ns)
        except OSError:
            out.append(0)
    return tuple(out)


def _stamps(runs_dir: Path) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if not runs_dir.is_dir():
        return ()
    return tuple((p.name, stamp(p)) for p in sorted(runs_dir.iterdir()) if p.is_dir())


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def _records(runs_dir: str, stamps: tuple[Any, ...]) -> list[dict[str, Any]]:
    records = [r for r in store.list_runs(Path(runs_dir)) if paths.inside(Path(r["path"]), Path(runs_dir))]
    for r in records:  # a live run has no stored summary yet: compute it from what was flushed
        if r.get("problems"):
            r["problems"] = [shown(p, Path(runs_dir)) for p in r["problems"]]
        if r.get("status") in LIVE:
            r["summary"] = _live_summary(r["path"], stamp(Path(r["path"])))
    return records


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def _live_summary(path: str, run_stamp: tuple[int, ...]) -> dict[str, Any]:
    try:
        return summary_of(load_run(path))
    except store.StoreError:
        return {}


def records(runs_dir: Path) -> list[RunRecord]:
    """Every run's record (`store.list_runs`: newest first, corrupt ones with status `corrupt` and their
    `problems`)."""
    return [RunRecord(Path(r["path"]), r) for r in _records(str(runs_dir), _stamps(runs_dir))]


def _switches_changed(r: RunRecord) -> str:
    try:
        changed = report_run.preset_changes(r)
    except ConfigError:
        return "preset not known"
    return ", ".join(c for c in changed if c.startswith("switches.")) or "none"


def _row(r: RunRecord) -> dict[str, Any]:
    summary = r.stored_summary or {}
    bottlenecks = r.diagnosis.get("bottlenecks") or []
    row: dict[str, Any] = {"run": r.id, "name": r.name or "", "status": r.status,
           "created": pd.to_datetime(r.created or "", utc=True, errors="coerce"),
           "preset": str(lookup(r.config, "model.preset") or ""),
           "switches changed": _switches_changed(r) if r.config else ""}
    row |= {label: METRIC_BY_NAME[name].value(summary) for label, name in METRIC_COLUMNS.items()}
    row["top bottleneck"] = bottlenecks[0]["kind"] if bottlenecks else ""
    row["note"] = "; ".join(r.record.get("problems") or []) or str(r.error or "")  # problems: the listing's own
    row["open"] = f"run?run={r.id}"
    return row


def runs_table(runs: Sequence[RunRecord]) -> pd.DataFrame:
    """One row per run: what the Runs page lists (metrics in their registry units, NaN when not measured)."""
    return pd.DataFrame([_row(r) for r in runs], columns=["run", "name", "status", "created", "preset",
                                                        "switches changed", *METRIC_COLUMNS, "top bottleneck",
                                                        "note", "open"])


def completed_ids(runs: Sequence[RunRecord]) -> list[str]:
    """The runs a comparison or a verification can use, newest first."""
    return [r.id for r in runs if r.status == "completed"]


def linked_runs(runs: Sequence[RunRecord], run_id: str) -> list[RunRecord]:
    """The runs made to verify `run_id` (run.json `verifies.run`), oldest first."""
    return [r for r in reversed(runs) if r.verifies.get("run") == run_id]


@dataclass(frozen=True)
class RunView:
    """One run as the Run page shows it, or why it cannot be read."""

    path: Path
    error: str = ""
    run: RunData | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    diagnosis: dict[str, Any] = field(default_factory=dict)
    figures: Figures = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.run.status if self.run is not None else "corrupt"

    @property
    def verification(self) -> dict[str, Any] | None:
        return self.run.verification if self.run is not None else None


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def _run_view(path: str, run_stamp: tuple[int, ...]) -> RunView:
    try:
        run = load_run(path)
    except store.StoreError as exc:
        return RunView(Path(path), error=str(exc))
    if run.problems:
        return RunView(Path(path), error=f"run {run.id} is corrupt: {'; '.join(run.problems)}", run=run)
    summary = summary_of(run)
    diagnosis = report_run.diagnosis_of(run, summary)
    return RunView(Path(path), run=run, summary=summary, diagnosis=diagnosis,
                   figures=report_run.run_figures(run, summary, diagnosis, run.verification))


def run_view(run_id: str, runs_dir: Path) -> RunView:
    """The run a page names (an id, a name or a directory inside the runs directory), read as it is now."""
    try:
        path = paths.served_run(run_id, runs_dir)
    except store.StoreError as exc:
        return RunView(runs_dir, error=str(exc))
    view = _run_view(str(path), stamp(path))
    return replace(view, error=shown(view.error, runs_dir))


def report_html(path: Path) -> str:
    """The run's HTML report, written now (what `glmperf report RUN` writes)."""
    return report_run.run_report(load_run(path))


def trace_paths(path: Path) -> list[Path]:
    """The run's chrome traces (traces/rank<r>.json.gz), for download: files of the run's own, no link."""
    return [p for p in store.trace_paths(path) if paths.inside(p, path) and p.is_file()]


def file_bytes(path: Path) -> bytes:
    return path.read_bytes()


@dataclass(frozen=True)
class CompareView:
    """A comparison as the Compare page shows it, or why it cannot be made."""

    error: str = ""
    comparison: Comparison | None = None
    figures: Figures = field(default_factory=list)


def _sides(runs_dir: Path, base: Sequence[str], cand: Sequence[str]) -> tuple[list[RunData], list[RunData]]:
    """The runs of each side, each one a run inside the runs directory (StoreError for any other)."""
    from profiler.compare.sides import load_sides

    def served(refs: Sequence[str]) -> list[str]:
        return [str(paths.served_run(ref, runs_dir)) for ref in refs]

    return load_sides(served(base), served(cand), runs_dir)


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def _compare_view(runs_dir: str, base: tuple[str, ...], cand: tuple[str, ...], stamps: tuple[Any, ...]
                  ) -> CompareView:
    from profiler.compare.gate import GateError, make_gate  # scipy: only once a comparison is asked for
    from profiler.compare.runs import compare
    from reports import report_compare

    try:
        b, c = _sides(Path(runs_dir), base, cand)
        result = compare(b, c, make_gate())
    except (store.StoreError, GateError, ValueError) as exc:
        return CompareView(error=shown(str(exc), Path(runs_dir)))
    return CompareView(comparison=result, figures=report_compare.compare_figures(b, c, result))


def compare_view(runs_dir: Path, base: Sequence[str], cand: Sequence[str]) -> CompareView:
    """Baseline runs vs candidate runs with the default gate, as `glmperf compare` makes it."""
    return _compare_view(str(runs_dir), tuple(base), tuple(cand), _stamps(runs_dir))


def compare_html(runs_dir: Path, base: Sequence[str], cand: Sequence[str]) -> str:
    """The comparison's HTML report, written now (what `glmperf report --compare` writes)."""
    from profiler.compare.gate import make_gate
    from profiler.compare.runs import compare
    from reports import report_compare

    b, c = _sides(runs_dir, base, cand)
    return report_compare.compare_report(b, c, compare(b, c, make_gate()))


def _plan_stamps(runs_dir: Path, kind: str) -> tuple[tuple[str, int], ...]:
    folder = runs_dir / experiment_records.KINDS[kind]
    return tuple((str(p), p.stat().st_mtime_ns) for p in sorted(folder.glob(f"*/{kind}.json"))
                 if paths.inside(p.parent, runs_dir)) if folder.is_dir() else ()


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def _sweeps(runs_dir: str, stamps: tuple[tuple[str, int], ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path, _ in stamps:
        try:
            _, sweep = report_sweep.read_sweep(Path(path).parent, Path(runs_dir))
        except store.StoreError as exc:
            out.append({"id": Path(path).parent.name, "created": "", "error": shown(str(exc), Path(runs_dir))})
            continue
        out.append({"id": sweep["id"], "created": sweep.get("created") or "", "record": sweep,
                    "figures": report_sweep.sweep_figures(sweep), "best": report_sweep.best_cells(sweep),
                    "cells": report_sweep.cell_rows(sweep)})
    return sorted(out, key=lambda s: s["created"], reverse=True)


def sweeps(runs_dir: Path) -> list[dict[str, Any]]:
    """Every sweep record, newest first, with its figures and tables (or the `error` that hides them)."""
    return _sweeps(str(runs_dir), _plan_stamps(runs_dir, "sweep"))


TUNE_HEADERS = ["round", "diagnosis", "tried", "expected", "verdict", "measured", "decision"]


def _tune_rows(record: dict[str, Any]) -> list[list[str]]:
    rows = []
    for e in record.get("rounds") or []:
        result = e.get("result") or {}
        rows.append([str(e["round"]), e.get("diagnosis", ""), settings.settings_text(e.get("tried") or {}),
                     text.expected_text(e) if e.get("expected") else "", result.get("verdict", ""),
                     text.measured_text(result["measured"]) if result.get("measured") else "",
                     f"{e.get('decision', '')}: {e.get('why', '')}"])
    return rows


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def _tunes(runs_dir: str, stamps: tuple[tuple[str, int], ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path, _ in stamps:
        try:
            record = experiment_records.read(Path(path).parent, "tune")
        except store.StoreError as exc:
            out.append({"id": Path(path).parent.name, "created": "", "error": shown(str(exc), Path(runs_dir))})
            continue
        out.append({"id": record["id"], "created": record.get("created") or "", "record": record,
                    "rows": _tune_rows(record),
                    "tuned_yaml": experiment_records.tuned_yaml(record) if record.get("tuned") else None})
    return sorted(out, key=lambda t: t["created"], reverse=True)


def tunes(runs_dir: Path) -> list[dict[str, Any]]:
    """Every tune record, newest first: its rounds as rows and the tuned config (None until it ends)."""
    return _tunes(str(runs_dir), _plan_stamps(runs_dir, "tune"))


def fmt_metric(name: str, summary: dict[str, Any]) -> str:
    """A summary figure in its registry unit and digits, as the report's table prints it."""
    m = METRIC_BY_NAME[name]
    value = text.fmt(m.value(summary), m.digits)
    return value if value == "n/a" else f"{value} {m.unit}".strip()
