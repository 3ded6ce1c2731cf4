"""The analysis core: one way into a stored run, and a summary that any stored run reproduces."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from profiler import store
from profiler.analysis import load_run, summarize, summary_of
from profiler.analysis.steps import merge_ranks
from profiler.metrics import METRICS, PHASE_COLUMNS, PHASES
from tests.conftest import copy_run

DOCS = Path(__file__).resolve().parent.parent / "docs"


def same(a: Any, b: Any) -> bool:
    """Exact equality of JSON-shaped data, NaN equal to NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("fixture", ["completed_run", "failed_run", "interrupted_run"])
def test_re_summarizing_a_stored_run_gives_the_stored_summary_exactly(fixture: str, request) -> None:
    run_dir: Path = request.getfixturevalue(fixture)
    stored = json.loads((run_dir / "run.json").read_text())["summary"]
    assert stored["steps_counted"] > 0
    assert same(summarize(load_run(run_dir)), stored)


@pytest.mark.slow
def test_re_summarizing_a_two_rank_run_gives_the_stored_summary_exactly(two_rank_run: Path) -> None:
    stored = json.loads((two_rank_run / "run.json").read_text())["summary"]
    assert same(summarize(load_run(two_rank_run)), stored)


@pytest.mark.slow
def test_shares_describe_the_slowest_ranks_critical_path(two_rank_run: Path) -> None:
    steps = store.read_table(two_rank_run, "steps")
    steady = steps[steps["step"] >= 1]
    slowest = steady.loc[steady.groupby("step")["step_s"].idxmax()]
    share = store.read_run(two_rank_run)["summary"]["phase_share"]
    for phase in PHASES:
        assert share[phase.name] == pytest.approx(slowest[phase.column].sum() / slowest["step_s"].sum(), rel=1e-9)
    assert sum(share.values()) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.slow
def test_steps_recorded_by_only_some_ranks_are_left_out_and_said(two_rank_run: Path) -> None:
    steps = store.read_table(two_rank_run, "steps")
    lost = steps[~((steps["rank"] == 1) & (steps["step"] >= 4))]  # rank 1's rows of steps 4 and 5 never flushed
    merged, notes, _ = merge_ranks(lost, world_size=2)
    assert list(merged.index) == [0, 1, 2, 3]
    assert notes == ["step(s) 4-5 were recorded by fewer than all 2 ranks (a rank stopped early) and are left out"]
    assert (merged["tokens"] == 2 * 4 * 32).all()


def test_a_live_run_is_read_from_its_parts_and_summarized_so_far(live_run: Path) -> None:
    run = load_run(live_run)
    assert run.status == "running" and not run.ended and not (live_run / "steps.parquet").exists()
    assert list(run.steps["step"]) == list(range(6))
    assert run.rank(0)["status"] == "running" and run.rank(0)["flops_per_token"] > 0
    summary = summary_of(run)
    counted = run.steps[run.steps["step"] >= 1]
    assert summary["steps_counted"] == 5
    assert summary["tokens_per_s"] == pytest.approx(counted["tokens"].sum() / counted["step_s"].sum(), rel=1e-12)
    assert summary["mfu"] > 0  # the peak was measured when the run was created
    assert "still running" in summary["notes"][-1]


def test_a_killed_run_is_summarized_from_what_was_flushed(killed_run: Path) -> None:
    run = load_run(killed_run)
    assert run.status == "incomplete"
    summary = summary_of(run)
    assert summary["steps_counted"] == len(run.steps) - 1 and summary["tokens_per_s"] > 0
    assert "killed" in summary["notes"][-1] and "glmperf finalize" in summary["notes"][-1]


def test_a_truncated_table_makes_the_run_corrupt_and_says_which(completed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    path = run_dir / "steps.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    run = load_run(run_dir)
    assert run.status == "corrupt" and run.steps.empty
    assert len(run.problems) == 1 and run.problems[0].startswith("steps.parquet is not readable parquet")
    (listed,) = store.list_runs(tmp_path)
    assert listed["status"] == "corrupt" and listed["stored_status"] == "completed"


def test_a_missing_table_makes_the_run_corrupt(completed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    (run_dir / "steps.parquet").unlink()
    assert load_run(run_dir).problems == ["steps.parquet is missing"]


def test_a_truncated_run_json_is_one_clear_error(completed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    (run_dir / "run.json").write_text((run_dir / "run.json").read_text()[:200])
    with pytest.raises(store.StoreError, match=r"run\.json is not valid JSON \(truncated or damaged"):
        load_run(run_dir)
    (listed,) = store.list_runs(tmp_path)
    assert listed["status"] == "corrupt" and "not valid JSON" in listed["problems"][0]


def test_runs_are_found_by_directory_id_or_name(completed_run: Path) -> None:
    runs_dir = completed_run.parent
    assert store.resolve_run(completed_run, runs_dir) == completed_run
    assert store.resolve_run(completed_run.name, runs_dir) == completed_run
    assert store.resolve_run("completed", runs_dir) == completed_run
    with pytest.raises(store.StoreError, match="no run 'nope'"):
        store.resolve_run("nope", runs_dir)


def test_every_metric_reads_its_stored_figure(completed_run: Path) -> None:
    summary = store.read_run(completed_run)["summary"]
    merged = merge_ranks(store.read_table(completed_run, "steps"), 1)[0]
    assert summary_of(load_run(completed_run)) == summary
    for m in METRICS:
        stored = m.value(summary)
        if m.name in ("comm_bytes_per_step", "comm_overlap", "straggler"):  # one process: none
            assert math.isnan(stored), m.name
            continue
        assert not math.isnan(stored), m.name
        if m.per_step is not None:
            assert isinstance(m.per_step(merged, summary), pd.Series), m.name


def test_the_docs_list_every_phase_and_metric() -> None:
    text = (DOCS / "run-format.md").read_text()
    for phase in PHASES:
        assert f"`{phase.column}`" in text, phase.column
    for m in METRICS:
        assert f"`{m.name}`" in text, m.name
    assert [c for c in PHASE_COLUMNS] == [f"{p.name}_s" for p in PHASES]


def test_a_grad_norm_spike_is_an_outlier_and_early_trainings_fall_is_not(completed_run: Path) -> None:
    import dataclasses

    from profiler.analysis import stability

    run = load_run(completed_run)
    falling = [12.0, 8.6, 6.8, 5.2, 3.5, 2.6, 3.0, 2.6]  # a real run's first steps: no spike among them
    steps = run.steps.assign(grad_norm=falling)
    assert stability.analyze(dataclasses.replace(run, steps=steps), {})["grad_norm_outliers"].value == 0
    spiked = steps.assign(grad_norm=[1.0] * 6 + [50.0, 1.0])
    assert stability.analyze(dataclasses.replace(run, steps=spiked), {})["grad_norm_outliers"].value == 1


def test_a_config_without_a_profile_setting_reads_profile_configs_default(completed_run: Path) -> None:
    from profiler.analysis import RunRecord
    from profiler.settings import ProfileConfig

    imported = RunRecord(completed_run, {"source": "import", "config": {}})  # what glmperf import stores
    assert imported.warmup_steps == 0  # its traces hold the profiler's active steps only
    assert RunRecord(completed_run, {"config": {}}).warmup_steps == ProfileConfig().warmup_steps
    assert imported.memory_budget_gb == ProfileConfig().memory_budget_gb
    assert imported.device == "cpu" and not imported.on_cuda and imported.world_size == 1
    assert imported.diagnosis == {} and imported.verification is None and imported.stored_summary is None
    assert load_run(completed_run).warmup_steps == 1  # the stored config's own (tests.conftest.TINY)


def test_the_cached_steady_steps_are_what_the_summary_counts(completed_run: Path) -> None:
    run = load_run(completed_run)
    assert run.steady_steps is run.steady_steps  # computed once per loaded run
    summary = summarize(run)
    assert len(run.steady_steps) == summary["steps_counted"] > 0
    assert len(run.merged_steps) == summary["steps_total"]
    assert run.steady_steps.index.min() >= run.merged_steps.index.min() + run.warmup_steps
    assert float(run.steady_steps["step_s"].max()) == summary["step_time_s"]["max"]
