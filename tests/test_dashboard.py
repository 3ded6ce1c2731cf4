"""The dashboard's pages under Streamlit's AppTest, over one runs directory of real tiny runs: completed,
failed, interrupted, two ranks, still running, and two corrupt ones (bad JSON, a missing parquet).
Contents are checked against run.json and against profiler's own comparison, not just for no exception."""

from __future__ import annotations

import argparse
import html
import json
import shutil
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import cli, jobs
from profiler import text
from profiler.analysis import load_run, summary_of
from profiler.compare.gate import make_gate
from profiler.compare.runs import compare
from profiler.experiments import records
from profiler.metrics import METRIC_BY_NAME
from reports.plotting import title
from reports.report_run import diagnosis_of, run_figures
from tests.conftest import copy_run
from tests.test_report_pages import XSS, write_sweep

APP = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
BAD_JSON, NO_PARQUET = "20260101-000000-badjson-000000", "20260101-000000-noparquet-000000"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, completed_run: Path, failed_run: Path, interrupted_run: Path,
         two_rank_run: Path, live_run: Path) -> Path:
    """One runs directory holding a copy of each kind of run, two corrupt ones and a sweep."""
    root = tmp_path_factory.mktemp("dashboard") / "runs"
    root.mkdir()
    for run in (completed_run, failed_run, interrupted_run, two_rank_run, live_run):
        copy_run(run, root)
    bad = Path(shutil.copytree(completed_run, root / BAD_JSON))
    (bad / "run.json").write_text((bad / "run.json").read_text()[:200])
    missing = Path(shutil.copytree(completed_run, root / NO_PARQUET))
    (missing / "steps.parquet").unlink()
    stored = json.loads((missing / "run.json").read_text())
    (missing / "run.json").write_text(json.dumps({**stored, "id": NO_PARQUET}))
    write_sweep(root, [completed_run, two_rank_run])
    write_tune(root, record(completed_run))
    return root


def write_tune(root: Path, run: dict) -> None:
    """A finished tune record in the shape `glmperf tune` stores: one adopted round, one refused."""
    measured = {"metric": "tokens_per_s", "change_pct": 41.0, "low_pct": 30.5, "high_pct": 52.0, "confidence": 0.99,
                "runs": [2, 2]}
    rounds = [{"round": i, "diagnosed_run": run["id"], "diagnosis": f"finding {i}", "bottlenecks": ["input_bound"],
               "tried": tried, "for": "input_bound",
               "expected": {"tokens_per_s": {"low": 20.0, "high": 60.0, "unit": "%"}, "basis": "catalog"},
               "result": {"verdict": verdict, "measured": measured, "reason": "measured"},
               "decision": decision, "why": why}
              for i, tried, verdict, decision, why in (
                  (1, {"switches.dataloader.num_workers": 2}, "confirmed", "adopted", "confirmed within budget"),
                  (2, {"switches.compile.mode": "default"}, "inconclusive", "refused", f"not confirmed {XSS}"))]
    figures = {"run": run["id"], "tokens_per_s": 1000.0, "peak_memory_gib": 1.0}
    records.create(root, "tune", "tiny", {
        "status": "completed", "spec": {"preset": "tiny", "repeats": 2}, "rounds": rounds,
        "adopted": [rounds[0]["tried"]], "stopped": "nothing left to try",
        "tuned": {"settings": rounds[0]["tried"], "config": {"name": "tiny", "switches": {"dataloader": {
            "num_workers": 2}}}, "start": figures, "end": {**figures, "tokens_per_s": 1410.0}}})


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def page(runs_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str = "runs", **params: str | list[str]) -> AppTest:
    """A page rendered by the real router, with query parameters, checked to have raised nothing."""
    monkeypatch.setenv("GLMPERF_RUNS", str(runs_dir))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update(params)
    at.switch_page(f"app_pages/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.main[0].type == "title", at.main[0]  # no stray text (a page's bare string is shown) above it
    return at


def texts(at: AppTest, *kinds: str) -> str:
    return "\n".join(str(e.value) for kind in kinds for e in getattr(at, kind))


def test_runs_page_lists_every_run_with_its_figures(runs: Path, completed_run: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    at = page(runs, monkeypatch)
    assert [t.value for t in at.title] == ["Runs"]
    table = at.dataframe[0].value.set_index("run")
    ids = {record(p)["id"] for p in runs.iterdir() if p.name not in (BAD_JSON, "sweeps", "tunes")} | {BAD_JSON}
    assert set(table.index) == ids
    assert table.loc[BAD_JSON, "status"] == "corrupt" and "not valid JSON" in table.loc[BAD_JSON, "note"]
    assert table.loc[NO_PARQUET, "status"] == "corrupt" and "steps.parquet is missing" in table.loc[NO_PARQUET, "note"]
    assert set(table["status"]) == {"completed", "failed", "interrupted", "running", "corrupt"}
    done = record(completed_run)
    row = table.loc[done["id"]]
    assert row["tokens/s"] == pytest.approx(done["summary"]["tokens_per_s"])
    assert row["step p50 (ms)"] == pytest.approx(1e3 * done["summary"]["step_time_s"]["p50"])
    assert row["MFU (%)"] == pytest.approx(100 * done["summary"]["mfu"])
    assert row["top bottleneck"] == done["diagnosis"]["bottlenecks"][0]["kind"]
    assert row["preset"] == "tiny" and row["open"] == f"run?run={done['id']}"

    at.text_input(key="filter").input("interrupted").run()
    assert list(at.dataframe[0].value["status"]) == ["interrupted"]
    at.text_input(key="filter").input("").run()
    at.multiselect(key="statuses").select("corrupt").run()
    assert set(at.dataframe[0].value["run"]) == {BAD_JSON, NO_PARQUET}


def test_selecting_runs_links_to_them(runs: Path, completed_run: Path, two_rank_run: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    at = page(runs, monkeypatch)
    table = at.dataframe[0].value
    rows = [int(table.index[table["run"] == record(r)["id"]][0]) for r in (completed_run, two_rank_run)]
    at.session_state["runs"] = {"selection": {"rows": rows, "columns": [], "cells": []}}
    at.run()
    links = [link.value for link in at.get("page_link")]
    older, newer = sorted((record(r) for r in (completed_run, two_rank_run)), key=lambda r: r["created"])
    assert links == [f"Compare {older['id']} (baseline) with {newer['id']}"]


def test_run_page_shows_the_stored_run(runs: Path, completed_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = record(completed_run)
    at = page(runs, monkeypatch, "run", run=done["id"])
    assert [h.value for h in at.header] == [done["id"]]
    metrics = {m.label: m.value for m in at.metric}
    for name in ("tokens_per_s", "step_time_p50", "peak_memory", "mfu"):
        m = METRIC_BY_NAME[name]
        assert metrics[m.label] == f"{text.fmt(m.value(done['summary']), m.digits)} {m.unit}"
    assert done["diagnosis"]["verdict"] in texts(at, "markdown")
    commands = {c.value for c in at.code}
    assert {r["command"] for r in done["diagnosis"]["recommendations"]} <= commands
    run = load_run(completed_run)
    summary = summary_of(run)
    figures = run_figures(run, summary, diagnosis_of(run, summary), None)
    shown = [html.unescape(json.loads(c.proto.spec)["layout"]["title"]["text"]) for c in at.get("plotly_chart")]
    assert shown == [title(f) for _, f, _ in figures if f is not None] and len(shown) >= 8
    assert [b.label for b in at.get("download_button")][0] == "HTML report"
    assert any("rank0.json.gz" in b.label for b in at.get("download_button"))
    assert not at.error and not at.warning


def test_run_page_states(runs: Path, failed_run: Path, interrupted_run: Path, live_run: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    failed = page(runs, monkeypatch, "run", run=record(failed_run)["id"])
    assert record(failed_run)["error"] in texts(failed, "error")
    assert "failed after" in texts(failed, "error") and failed.get("plotly_chart")
    assert "interrupted" in texts(page(runs, monkeypatch, "run", run=record(interrupted_run)["id"]), "warning")
    live = page(runs, monkeypatch, "run", run=record(live_run)["id"])
    assert "still running" in texts(live, "warning") and live.get("plotly_chart")
    assert "not valid JSON" in texts(page(runs, monkeypatch, "run", run=BAD_JSON), "error")
    assert "steps.parquet is missing" in texts(page(runs, monkeypatch, "run", run=NO_PARQUET), "error")
    assert "no run 'nope'" in texts(page(runs, monkeypatch, "run", run="nope"), "error")


def test_compare_page_gives_compares_verdicts(runs: Path, completed_run: Path, two_rank_run: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    base, cand = record(completed_run)["id"], record(two_rank_run)["id"]
    at = page(runs, monkeypatch, "compare", base=base, cand=cand)
    expected = compare([load_run(completed_run)], [load_run(two_rank_run)], make_gate())
    assert f"Verdict: {expected.verdict}." in texts(at, "success", "error")
    table = at.dataframe[0].value
    assert list(table["metric"]) == [m.label for m in expected.metrics]
    assert list(table["verdict"]) == [m.estimate.verdict for m in expected.metrics]
    assert len(at.get("plotly_chart")) >= 3
    assert at.multiselect(key="base").value == [base] and at.multiselect(key="cand").value == [cand]


def test_compare_page_refuses_unfinished_and_corrupt_runs(runs: Path, completed_run: Path, failed_run: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    base = record(completed_run)["id"]
    failed = page(runs, monkeypatch, "compare", base=base, cand=record(failed_run)["id"])
    assert "not completed" in texts(failed, "error")
    assert "corrupt" in texts(page(runs, monkeypatch, "compare", base=base, cand=NO_PARQUET), "error")


def test_recommend_page_shows_recommendations_sweeps_and_tunes(runs: Path, completed_run: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    done = record(completed_run)
    at = page(runs, monkeypatch, "recommend", run=done["id"])
    recs = at.dataframe[0].value
    assert list(recs["to try"]) == [r["command"] for r in done["diagnosis"]["recommendations"]]
    assert "Not verified yet" in texts(at, "caption")
    assert at.button(key="verify").disabled is False
    assert at.selectbox(key="sweep").value == "sweep-1"
    assert "**Fastest:** cell" in texts(at, "markdown")
    assert len(at.get("plotly_chart")) >= 3  # recommendations, ablation, Pareto front
    tune = at.dataframe[-1].value
    assert list(tune["round"]) == ["1", "2"] and list(tune["verdict"]) == ["confirmed", "inconclusive"]
    assert tune["tried"][0] == "switches.dataloader.num_workers=2"
    assert tune["measured"][0].startswith("tokens/s gain +41.0% [+30.5%, +52.0%]")
    assert tune["decision"][1] == f"refused: not confirmed {XSS}"
    assert "1,000 (run" in texts(at, "markdown") and "1,410" in texts(at, "markdown")
    assert "num_workers: 2" in at.code[-1].value and "# round 1: switches.dataloader.num_workers=2: adopted" in \
        at.code[-1].value


@pytest.mark.parametrize("name", ["runs", "run", "compare", "recommend"])
def test_every_page_says_when_there_are_no_runs(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "No runs directory" in texts(page(tmp_path / "absent", monkeypatch, name), "info")
    (tmp_path / "empty").mkdir()
    assert "No runs in" in texts(page(tmp_path / "empty", monkeypatch, name), "info")


def test_dashboard_command(tmp_path: Path) -> None:
    argv, env = cli.command(argparse.Namespace(runs_dir=tmp_path, port=8765, host=cli.DEFAULT_HOST))
    assert argv[1:5] == ["-m", "streamlit", "run", str(APP)] and "8765" in argv
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert env["GLMPERF_RUNS"] == str(tmp_path.resolve())
    with pytest.raises(ValueError, match="--port"):
        cli.command(argparse.Namespace(runs_dir=tmp_path, port=0, host=cli.DEFAULT_HOST))


@pytest.mark.slow
def test_a_verification_runs_in_the_background_and_lands(completed_run: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    run_id = record(run_dir)["id"]
    job = jobs.start(run_id, tmp_path, top=1, repeats=1, steps=14)
    assert jobs.start(run_id, tmp_path, top=1, repeats=1, steps=14).pid == job.pid  # one at a time
    found = jobs.find(run_id, tmp_path)  # what a reloaded page finds
    assert found == job and found.running
    at = page(tmp_path, monkeypatch, "recommend", run=run_id)
    assert "Verification running" in texts(at, "markdown") and at.button(key="verify").disabled
    deadline = time.time() + 240
    while job.running and time.time() < deadline:
        time.sleep(1)
    assert not job.running, job.tail()
    verification = record(run_dir)["diagnosis"]["verification"]
    assert [r["verdict"] for r in verification["results"]], job.tail()
    at = page(tmp_path, monkeypatch, "recommend", run=run_id)
    assert "Verification finished" in texts(at, "markdown") and "verification of run" in job.tail()
    assert "Verified by rerunning: 1 repeat(s) of 14 steps" in texts(at, "caption")
    assert "2 run(s) made so far" in texts(at, "markdown")  # the fresh baseline and the change


def test_recommend_and_compare_pages_state_every_kind_of_run_clearly(
        runs: Path, completed_run: Path, failed_run: Path, live_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for ref in (record(failed_run)["id"], record(live_run)["id"], BAD_JSON, NO_PARQUET, "nope"):
        at = page(runs, monkeypatch, "recommend", run=ref)  # raises nothing (page() checks)
        assert texts(at, "error", "warning", "info", "caption"), ref
    running = page(runs, monkeypatch, "compare", base=record(completed_run)["id"], cand=record(live_run)["id"])
    assert "not completed" in texts(running, "error")
