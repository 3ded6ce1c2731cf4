"""The report of a sweep (its record, `<runs_dir>/sweeps/<id>/sweep.json`): the fastest and smallest
cells and the Pareto front first, then the ablation and Pareto figures, then the tables of cells,
ablation, interactions and refused settings.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from profiler import store
from profiler.experiments import records
from profiler.settings import settings_text
from reports import figures_sweep, html

BANNERS = {"running": "This sweep is still running: cells marked pending have no runs yet.",
           "interrupted": "This sweep was interrupted: cells marked pending were never run."}


def read_sweep(ref: str | Path, runs_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The sweep.json a reference names (its directory, the file, or its id) and the record in it;
    StoreError (one line) when there is none or it is not a sweep record."""
    record_dir = records.resolve(ref, runs_dir, "sweep")
    data = records.read(record_dir, "sweep")
    if not isinstance(data.get("cells"), list) or "id" not in data:
        raise store.StoreError(f"{record_dir / 'sweep.json'} is not a sweep record (no id or cells)")
    return record_dir / "sweep.json", data


def _interval(row: Mapping[str, Any]) -> str:
    if row.get("low_pct") is None or row.get("high_pct") is None:
        return "n/a (one pair: no interval)"
    return f"{row['low_pct']:+.1f}% to {row['high_pct']:+.1f}%"


def _range(m: Mapping[str, Any] | None, spec: str) -> str:
    if not m or not isinstance(m.get("median"), (int, float)):
        return "n/a"
    return f"{m['median']:{spec}} ({m['low']:{spec}} to {m['high']:{spec}})"


def _cell_text(cell: Mapping[str, Any]) -> str:
    return (f"cell {cell['index']} ({settings_text(cell.get('settings') or {}) or 'the reference'}): "
            f"{_range(cell.get('tokens_per_s'), ',.0f')} tokens/s, {_range(cell.get('peak_memory_gib'), '.3f')} GiB")


def best_cells(sweep: Mapping[str, Any]) -> dict[str, str]:
    measured = [c for c in sweep["cells"] if figures_sweep.measured(c)]
    if not measured:
        return {"fastest": "no cell measured yet", "smallest": "no cell measured yet", "front": "none yet"}
    by_index = {c["index"]: c for c in measured}
    front = [by_index[i] for i in sweep.get("pareto") or [] if i in by_index]
    return {"fastest": _cell_text(max(measured, key=lambda c: c["tokens_per_s"]["median"])),
            "smallest": _cell_text(min(measured, key=lambda c: c["peak_memory_gib"]["median"])),
            "front": "; ".join(_cell_text(c) for c in front) or "not computed"}


def _spec(sweep: Mapping[str, Any]) -> list[tuple[str, str]]:
    spec = sweep.get("spec") or {}
    cells = sweep["cells"]
    counts = ", ".join(f"{sum(c.get('status') == s for c in cells)} {s}" for s in ("done", "pending", "failed"))
    return [("preset", str(spec.get("preset"))),
            ("grid", "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in (spec.get("grid") or {}).items())),
            ("overrides", " ".join(map(str, spec.get("overrides") or [])) or "none"),
            ("repeats x steps", f"{spec.get('repeats')} x {spec.get('steps')} steps"),
            ("cells", f"{len(cells)}: {counts}")]


def cell_rows(sweep: Mapping[str, Any]) -> list[list[Any]]:
    """The cells table: index, settings, status, tokens/s and peak memory (median, low to high), runs."""
    return [[c["index"], settings_text(c.get("settings") or {}), c.get("status"), _range(c.get("tokens_per_s"), ",.0f"),
             _range(c.get("peak_memory_gib"), ".3f"), ", ".join(c.get("runs") or [])] for c in sweep["cells"]]


def sweep_figures(sweep: Mapping[str, Any]) -> list[tuple[str, go.Figure | None, str]]:
    """Every figure of a sweep's report in order: (name, figure or None, why it would be missing); the
    HTML report and the dashboard show these."""
    return [
        ("Ablation", figures_sweep.ablation(sweep), "no ablation computed"),
        ("Pareto front", figures_sweep.pareto(sweep), "no cell measured"),
    ]


def sweep_report(sweep: Mapping[str, Any], path: Path) -> str:
    """The HTML report of a sweep record read from `path`."""
    shown, missing = html.sections(sweep_figures(sweep))
    return html.render(
        "sweep.html", title=f"glmperf: sweep {sweep['id']}", sections=shown, missing=missing,
        sweep={"id": sweep["id"], "status": sweep.get("status"), "created": sweep.get("created")}, path=str(path),
        banner=BANNERS.get(str(sweep.get("status"))), best=best_cells(sweep), spec=_spec(sweep),
        cells=cell_rows(sweep),
        ablation=[[a["key"], str(a["value"]), str(a["reference"]), a["metric"], f"{a['change_pct']:+.1f}%",
                   _interval(a), a.get("pairs", "")]
                  for a in sweep.get("ablation") or []],
        interactions=[[" x ".join(i["keys"]), i["metric"], f"{i['change_pct']:+.1f}%", i.get("note", "")]
                      for i in sweep.get("interactions") or []],
        refused=[[settings_text(r.get("settings") or {}), r.get("reason", "")] for r in sweep.get("refused") or []],
        written=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
