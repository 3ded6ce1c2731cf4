"""The collectives matched across ranks in the run report, in Chromium and on the dashboard's run page, for a
real imported job: the shared 16-rank A100 job's rank 0 (its first two steps) tiled as six ranks, rank 5
DELAY_US late (every event of its trace later, the others' NCCL kernels that much longer: they wait for it
inside them, as tests/test_collective_report.py builds a pair). Each table cell is checked against the
figures the import stored in run.json; a single rank's report has no such table."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.import_ranks import tile_ranks
from profiler.cli import main
from reports.collectives_across import across_ranks
from reports.figures_machine import MANY_RANKS
from tests.test_collective_report import DELAY_US, SOURCE, _later, _rewrite, _waits
from tests.test_dashboard import page, texts
from tests.test_report_browser import CHROMIUM, ERRORS, chromium
from tests.test_report_pages import Page, values

RANKS, LATE = 6, 5
"""Past MANY_RANKS: the per-rank collectives figure draws a point a rank."""
HEADING = "Collectives across ranks"

pytestmark = pytest.mark.skipif(not SOURCE.exists(), reason="the shared traces are not on this machine")


def _import(root: Path, ranks: int) -> Path:
    """`glmperf import` of `root/traces`: the run's directory."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["import", str(root / "traces"), "--runs-dir", str(root / "runs"), "--workers", "1"]) == 0
    (run,) = (root / "runs").iterdir()
    return run


def _report(run: Path) -> str:
    out = run.parent.parent / "report.html"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", str(run), "-o", str(out)]) == 0
    return out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    (root / "traces").mkdir()
    files = tile_ranks(SOURCE, root / "traces", RANKS, steps=2)
    for rank, path in enumerate(files):
        _rewrite(path, _later if rank == LATE else _waits)
    return _import(root, RANKS)


def _stored(run: Path) -> dict[str, Any]:
    return json.loads((run / "run.json").read_text())["summary"]


def test_the_report_tables_each_kind_with_the_stored_figures(job: Path) -> None:
    across = _stored(job)["trace"]["collectives_across_ranks"]
    text = _report(job)
    shown = Page(text)
    assert ("h3", HEADING) in shown.headings
    assert shown.row("collective")[:4] == ["collective", "calls matched", "ranks", "skew p50 (ms)"]
    (group,) = across["groups"]  # the trace's kernels name no process group: the ranks imported are one
    assert across["groups_from"] == "ranks" and group["ranks"] == list(range(RANKS))
    assert set(group["kinds"]) >= {"all_to_all", "all_reduce", "reduce_scatter"}
    for kind, k in group["kinds"].items():
        row = shown.row(kind)
        assert k["skew_ms"]["p50"] == pytest.approx(DELAY_US / 1e3, abs=1e-3)  # the delay, as the JSON has it
        assert row[1:6] == [str(k["calls"]), str(RANKS), f"{k['skew_ms']['p50']:.2f}", f"{k['skew_ms']['p90']:.2f}",
                            f"rank {LATE}, 100% of calls"]
        assert row[6] == f"{100 * k['waiting_share']:.0f}% of {k['time_s']:.3f} s"
        if k["busbw_gb_s"] is None:
            assert row[7:] == ["no payload bytes", "-"]
        else:
            assert row[7:] == [f"{k['busbw_gb_s']:.1f}", f"{100 * k['busbw_of_peak']:.0f}% of 300 GB/s"]
    s = across["straggler"]
    assert s["rank"] == LATE
    assert (f"Straggler: rank {LATE} arrived last in 100% of {s['calls']} {s['kind']} calls, a median "
            f"{s['skew_ms']:.1f} ms after the first rank") in text
    assert "Skew: the last rank&#39;s kernel start minus the first&#39;s" in text and "Waiting: " in text
    assert "NVLink 3: 600 GB/s per GPU both ways" in text


def test_the_per_rank_figure_shows_who_waits(job: Path) -> None:
    """What the table only sums: per rank, the late rank's collectives are the least exposed (it waits least)."""
    assert RANKS > MANY_RANKS
    (spec,) = Page(_report(job)).sections["communication-by-collective"]["specs"]
    ranks = _stored(job)["trace"]["ranks"]
    for trace, field in zip(spec["data"], ("time_s", "exposed_s"), strict=True):
        assert trace["type"] == "box" and trace["boxpoints"] == "all"
        drawn = {(rank, kind): x for rank, kind, x in zip(trace["text"], trace["y"], values(trace["x"]), strict=True)}
        assert drawn == pytest.approx({(f"rank {r}", kind): 1e3 * k[field] for r, f in ranks.items()
                                       for kind, k in f["collectives"]["kinds"].items()})
        if field == "exposed_s":
            for kind in {kind for _, kind in drawn}:
                others = [x for (rank, k), x in drawn.items() if k == kind and rank != f"rank {LATE}"]
                assert drawn[(f"rank {LATE}", kind)] < min(others)


def test_a_single_rank_s_report_has_no_such_table(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    tile_ranks(SOURCE, tmp_path / "traces", 1, steps=2)
    run = _import(tmp_path, 1)
    assert "collectives_across_ranks" not in _stored(run)["trace"]
    text = _report(run)
    assert HEADING not in text and "Straggler" not in text and "Run " in text


def test_the_table_takes_the_fields_a_summary_has(job: Path) -> None:
    """Process groups, where the import told them apart, get their column; a summary without the straggler,
    the last rank or the bandwidths still gives a table, and so does one of an import from before groups
    (its `kinds` at the top)."""
    summary = _stored(job)
    across = summary["trace"]["collectives_across_ranks"]
    (group,) = across["groups"]
    across["groups_from"] = "process_group"
    across["groups"] = [{**group, "name": "0", "description": "default_pg"},
                        {**group, "name": "1", "description": "tp", "ranks": [0, 2], "size": 2}]
    table = across_ranks(summary)
    assert table is not None and table.headers[1] == "process group"
    n = len(group["kinds"])
    everyone = ", ".join(map(str, range(RANKS)))
    assert [r[1] for r in table.rows] == [f"0 default_pg (ranks {everyone})"] * n + ["1 tp (ranks 0, 2)"] * n
    for k in group["kinds"].values():
        for field in ("last", "busbw_gb_s", "link", "link_peak_gb_s", "waiting_share", "unmatched"):
            k.pop(field, None)
    summary["trace"]["collectives_across_ranks"] = {"kinds": group["kinds"]}  # no groups, no straggler
    bare = across_ranks(summary)
    assert bare is not None and "process group" not in bare.headers and bare.links == []
    assert {r[5] for r in bare.rows} == {"-"} and {r[7] for r in bare.rows} == {"no payload bytes"}
    assert bare.straggler.startswith("No straggler named")


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}")
def test_the_report_renders_the_table_in_chromium(job: Path) -> None:
    _report(job)
    dom = chromium(job.parent.parent / "report.html", "--dump-dom")
    assert not ERRORS.search(dom) and '<div id="script-errors" hidden="">' in dom
    assert f'<h3 id="collectives-across-ranks">{HEADING}</h3>' in dom
    assert f"Straggler: rank {LATE} arrived last" in dom and 'class="main-svg"' in dom


def test_the_dashboard_s_run_page_shows_the_table(job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    across = _stored(job)["trace"]["collectives_across_ranks"]
    at = page(job.parent, monkeypatch, "run", run=job.name)
    assert HEADING in [s.value for s in at.subheader]
    (table,) = [d.value for d in at.dataframe if "skew p50 (ms)" in d.value.columns]
    table = table.set_index("collective")
    for kind, k in across["groups"][0]["kinds"].items():
        assert table.loc[kind, "calls matched"] == str(k["calls"])
        assert table.loc[kind, "skew p90 (ms)"] == f"{k['skew_ms']['p90']:.2f}"
        assert table.loc[kind, "last most often"] == f"rank {LATE}, 100% of calls"
    assert f"Straggler: rank {LATE} arrived last" in texts(at, "markdown")
    assert "Waiting: " in texts(at, "caption") and not at.error
