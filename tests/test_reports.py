"""glmperf report on real stored tiny runs (conftest's session fixtures): the content of each kind of
report, its numbers against run.json, one figure per section, a single self-contained file, and
escaping of everything a run's user wrote."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import plotly.offline
import pytest

from profiler import plugins, store
from profiler.cli import main
from profiler.metrics import METRIC_BY_NAME, PHASES
from profiler.text import fmt
from tests.conftest import copy_run
from tests.test_report_pages import XSS, Page, summary_of_json, values, write_sweep


def report(*args: str, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, Page]:
    assert main(["report", *args, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out}"
    text = out.read_text(encoding="utf-8")
    return text, Page(text)


def assert_self_contained(text: str, page: Page) -> None:
    assert 'src="http' not in text and "src='http" not in text
    assert text.count(plotly.offline.get_plotlyjs()) == 1
    assert [t for t, _ in page.scripts].count("text/javascript") == 3  # error hook, plotly.js, the loader
    for anchor, s in page.sections.items():
        assert s["plots"] == 1 and len(s["specs"]) == 1, anchor


def test_completed_run_report(completed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, page = report(str(completed_run), out=tmp_path / "r.html", capsys=capsys)
    record = json.loads((completed_run / "run.json").read_text())
    summary = record["summary"]
    assert_self_contained(text, page)
    assert page.headings[0] == ("h1", f"Run {completed_run.name} completed")
    assert [h for t, h in page.headings if t == "h2"] == ["Verdict", "Figures", "Tables"]
    assert set(page.sections) == {"step-time-breakdown", "step-time-over-the-run", "throughput-and-mfu",
                                  "memory-over-the-run", "device-samples", "data-wait-and-reads", "top-operators",
                                  "loss-and-grad-norm", "bottleneck-evidence", "recommendations"}
    assert "Communication (a single process has no collectives)" in " ".join(text.split())
    for name in ("tokens_per_s", "step_time_p50", "step_time_p90", "peak_memory", "mfu"):
        m = METRIC_BY_NAME[name]
        assert page.row(f"{m.label} ({m.unit})")[1].startswith(fmt(m.value(summary), m.digits)), name
    bars = {t["name"]: t["y"][0] for t in page.sections["step-time-breakdown"]["specs"][0]["data"]}
    mean_ms = 1e3 * summary["step_time_s"]["mean"]
    for p in PHASES:
        assert bars[p.name] == pytest.approx(mean_ms * summary["phase_share"][p.name])
    verdict = record["diagnosis"]["verdict"]
    assert verdict in html.unescape(" ".join(text.split()))
    top = record["diagnosis"]["recommendations"][0]
    assert page.row("change")  # the recommendations table
    assert any(r[-1] == top["command"] for r in page.rows if r)
    steps = page.sections["step-time-over-the-run"]["specs"][0]["data"][0]
    assert values(steps["x"]) == list(range(summary["steps_total"]))


def test_two_rank_report_shows_ranks_and_communication(two_rank_run: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    text, page = report(str(two_rank_run), out=tmp_path / "r.html", capsys=capsys)
    assert_self_contained(text, page)
    assert "communication" in page.sections
    bars = page.sections["step-time-breakdown"]["specs"][0]["data"][0]["x"]
    assert bars == ["step (slowest rank)", "rank 0", "rank 1"]
    summary = summary_of_json(two_rank_run)
    m = METRIC_BY_NAME["comm_bytes_per_step"]
    assert page.row(f"{m.label} ({m.unit})")[1] == fmt(m.value(summary), m.digits)
    assert [r[:2] for r in page.rows if r and r[0] in ("0", "1")] == [["0", "completed"], ["1", "completed"]]


@pytest.mark.parametrize(("fixture", "banner"), [
    ("failed_run", "This run failed after 6 recorded step(s)"),
    ("interrupted_run", "This run was interrupted (SIGINT/SIGTERM) after 5 recorded step(s)"),
    ("live_run", "This run is still running: 6 step(s) flushed so far"),
])
def test_unfinished_runs_say_so(fixture: str, banner: str, request: pytest.FixtureRequest, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = request.getfixturevalue(fixture)
    text, page = report(str(run_dir), out=tmp_path / "r.html", capsys=capsys)
    assert_self_contained(text, page)
    assert banner in text
    assert {"step-time-over-the-run", "loss-and-grad-norm"} <= set(page.sections)
    status = json.loads((run_dir / "run.json").read_text())["status"]
    assert page.headings[0][1].endswith(status)
    if fixture == "failed_run":  # the error, brackets and all, as text
        assert "induced failure at step 5 [/bold] [process RSS (CPU)]" in text


def test_user_text_never_becomes_markup(completed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    record = store.read_run(run_dir)
    store.update_run(run_dir, name=XSS, error=f"RuntimeError: {XSS}",
                     config={**record["config"], "name": XSS, "data": {**record["config"]["data"], "corpus": [XSS]}})
    text, page = report(str(run_dir), out=tmp_path / "x.html", capsys=capsys)
    _, clean = report(str(completed_run), out=tmp_path / "c.html", capsys=capsys)
    assert XSS not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert [t for t, _ in page.scripts] == [t for t, _ in clean.scripts]
    assert not any("alert(1)" in body for kind, body in page.scripts if kind != "application/json")


def test_verified_recommendations_side_by_side(completed_run: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    diagnosis = store.read_run(run_dir)["diagnosis"]
    top = diagnosis["recommendations"][0]
    result = {"switch": top["switch"], "set": top["set"], "judged_by": top["judged_by"], "expected": top["expected"],
              "measured": {"metric": "tokens_per_s", "change_pct": 7.5, "low_pct": 2.25, "high_pct": 12.0},
              "verdict": "confirmed", "reason": "a gain of 7.5%", "runs": ["a", "b"]}
    store.update_run(run_dir, diagnosis={**diagnosis, "verification": {
        "repeats": 2, "steps": 8, "baseline_runs": ["base-1"], "results": [result]}})
    text, page = report(str(run_dir), out=tmp_path / "v.html", capsys=capsys)
    traces = {t["name"]: t for t in page.sections["recommendations"]["specs"][0]["data"]}
    assert traces["verified"]["x"][-1] == 7.5  # the top recommendation is drawn last (on top)
    exp = top["expected"]["tokens_per_s"]
    assert traces["expected"]["x"][-1] == pytest.approx((exp["low"] + exp["high"]) / 2)
    row = next(r for r in page.rows if r and r[-1] == top["command"])
    assert row[3] == "confirmed: tokens_per_s +7.5% (+2.2% to +12.0%); a gain of 7.5%"
    assert "verified: confirmed" in " ".join(text.split())


def test_compare_report(completed_run: Path, two_rank_run: Path, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    from profiler.analysis import load_run
    from profiler.compare.gate import make_gate
    from profiler.compare.runs import compare

    text, page = report("--compare", str(completed_run), str(two_rank_run), out=tmp_path / "c.html", capsys=capsys)
    assert_self_contained(text, page)
    assert [h for t, h in page.headings if t == "h2"] == ["Verdict", "Figures", "Tables"]
    assert set(page.sections) == {"change-per-metric", "step-time-distributions", "breakdowns-side-by-side",
                                  "config-diff"}
    c = compare([load_run(completed_run)], [load_run(two_rank_run)], make_gate())
    assert page.headings[0][1] == f"Comparison {c.verdict}"
    for m in c.metrics:
        digits = METRIC_BY_NAME[m.name].digits
        assert page.row(m.label)[2:4] == [fmt(m.estimate.base, digits), fmt(m.estimate.cand, digits)]
    deltas = page.sections["change-per-metric"]["specs"][0]["data"][0]
    expected = [100 * m.estimate.change for m in reversed(c.metrics)]
    assert [x is None for x in deltas["x"]] == [math.isnan(x) for x in expected]  # no change defined: no point
    assert [x for x in deltas["x"] if x is not None] == pytest.approx([x for x in expected if not math.isnan(x)])
    diff = page.sections["config-diff"]["specs"][0]["data"][0]["cells"]["values"]
    assert "train.steps" in diff[1] and "world_size" in diff[1]


def test_sweep_report(completed_run: Path, two_rank_run: Path, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path, [completed_run, two_rank_run])
    for ref in (str(path), str(path.parent)):
        text, page = report("--sweep", ref, out=tmp_path / "s.html", capsys=capsys)
        assert_self_contained(text, page)
    assert main(["report", "--sweep", "sweep-1", "--runs-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {path.parent / 'report.html'}"
    assert set(page.sections) == {"ablation", "pareto-front"}
    front = [t for t in page.sections["pareto-front"]["specs"][0]["data"] if t["name"] == "Pareto front"][0]
    tps = sorted((summary_of_json(r)["peak_memory_bytes"] / 2**30, summary_of_json(r)["tokens_per_s"])
                 for r in (completed_run, two_rank_run))
    assert values(front["x"]) == pytest.approx([m for m, _ in tps])
    assert values(front["y"]) == pytest.approx([t for _, t in tps])
    assert page.row("2")[2] == "pending"
    assert f"too big {XSS}" not in text and "too big &lt;script&gt;" in text
    fastest = max((0, 1), key=lambda i: summary_of_json((completed_run, two_rank_run)[i])["tokens_per_s"])
    assert re.search(rf"Fastest cell</dt>\s*<dd>cell {fastest} ", text)


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], failed_run: Path,
                               completed_run: Path) -> None:
    bad = tmp_path / "sweeps" / "broken" / "sweep.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"id": "broken", "cells": [')
    for args, says in ((["nosuch", "--runs-dir", str(tmp_path)], "no run 'nosuch'"),
                       (["--sweep", "nosuch", "--runs-dir", str(tmp_path)], "no sweep 'nosuch'"),
                       (["--sweep", "broken", "--runs-dir", str(tmp_path)], "is not valid JSON"),
                       (["--compare", str(completed_run), str(failed_run)], "is failed, not completed"),
                       (["--compare", str(completed_run)], "--compare takes BASE CAND")):
        assert main(["report", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("glmperf: error: ") and says in err and err.count("\n") == 1, err


def test_profile_run_hook_writes_report(completed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    (run_dir / "report.html").unlink(missing_ok=True)
    assert plugins.after_run(run_dir) == [("report", run_dir / "report.html")]
    assert store.report_path(run_dir) == run_dir / "report.html"
    assert Page((run_dir / "report.html").read_text()).headings[0][1].startswith(f"Run {run_dir.name}")
