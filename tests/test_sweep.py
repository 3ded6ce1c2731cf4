"""glmperf sweep: the grid's parsing, the ablation, interaction and Pareto arithmetic on synthetic numbers,
and real sweeps on `tiny` (stored runs, refused cells, an interrupt and its resume)."""

from __future__ import annotations

import itertools
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from profiler import store
from profiler.analysis import load_run, summary_of
from profiler.cli import main
from profiler.cli.sweep import print_sweep
from profiler.experiments import records, sweep
from profiler.metrics import METRIC_BY_NAME
from tests.conftest import ROOT, TINY, glmperf

FAST = [f"--set={o}" for o in (*TINY, "profile.trace=false")]
KEYS = ("schema_version", "id", "created", "status", "spec", "cells", "refused", "ablation", "interactions", "pareto")


# --- the grid -------------------------------------------------------------------------------------------------

def test_grid_values_parse_like_set_values() -> None:
    grid = sweep.parse_grid(["switches.amp=off,bf16", "train.batch_size=4,8",
                             "profile.trace_window=[1, 1, 2],[2, 1, 3]", "profile.trace=true,false"])
    assert grid == {"switches.amp": ["off", "bf16"], "train.batch_size": [4, 8],
                    "profile.trace_window": [[1, 1, 2], [2, 1, 3]], "profile.trace": [True, False]}
    text = sweep.settings_text({"switches.amp": "off", "profile.trace": False})
    assert text == "switches.amp=off profile.trace=false"


@pytest.mark.parametrize("text, says", [
    ("switches.amp", "expected section.key=v1,v2"),
    ("switches.amp=bf16", "at least 2 distinct values"),
    ("switches.amp=bf16,bf16", "at least 2 distinct values"),
    ("switches.amp=off,", "expected section.key=v1,v2"),
    ("switches.nope=a,b", "switches.nope: unknown key"),
    ("nope.x=1,2", "unknown section"),
])
def test_a_malformed_grid_is_refused_naming_it(text: str, says: str) -> None:
    with pytest.raises(sweep.SweepError, match=says):
        sweep.parse_grid([text])


def test_a_key_given_twice_is_refused() -> None:
    with pytest.raises(sweep.SweepError, match="given twice"):
        sweep.parse_grid(["switches.amp=off,bf16", "switches.amp=off,fp16"])


# --- the arithmetic on synthetic numbers ----------------------------------------------------------------------

def synthetic(grid: dict[str, list[Any]], figures: dict[tuple[int, ...], list[tuple[float, float]]]) -> dict[str, Any]:
    """A sweep record whose cell at grid levels L completed one run per (tokens/s, GiB) in figures[L]."""
    repeats = max((len(v) for v in figures.values()), default=1)
    cells = []
    for i, levels in enumerate(itertools.product(*(range(len(v)) for v in grid.values()))):
        settings = {k: grid[k][lv] for k, lv in zip(grid, levels, strict=True)}
        attempts = [{"repeat": r, "run": f"run-{i}-{r}", "status": "completed", "tokens_per_s": t, "peak_memory_gib": m}
                    for r, (t, m) in enumerate(figures.get(levels, []))]
        cells.append({"index": i, "settings": settings, "runs": [a["run"] for a in attempts], "attempts": attempts})
    spec = {"preset": "tiny", "config": None, "grid": grid, "overrides": [], "repeats": repeats, "steps": 10}
    return sweep.refresh({"status": "completed", "spec": spec, "cells": cells, "refused": []})


GRID = {"a": ["x", "y"], "b": ["u", "v"]}


def row(record: dict[str, Any], key: str, metric: str) -> dict[str, Any]:
    (found,) = [r for r in record["ablation"] if r["key"] == key and r["metric"] == metric]
    return found


def test_main_effects_are_paired_ratios_against_the_reference() -> None:
    # a=y doubles tokens/s at b=u and triples it at b=v; b=v halves memory; no noise across repeats
    record = synthetic(GRID, {(0, 0): [(100, 4)] * 2, (1, 0): [(200, 4)] * 2, (0, 1): [(100, 2)] * 2,
                              (1, 1): [(300, 2)] * 2})
    a = row(record, "a", "tokens_per_s")
    assert (a["value"], a["reference"], a["pairs"]) == ("y", "x", 4)
    assert a["change_pct"] == pytest.approx(100 * (math.sqrt(2 * 3) - 1))  # geometric mean of 2x and 3x
    assert a["low_pct"] < a["change_pct"] < a["high_pct"]
    assert row(record, "b", "peak_memory_gib")["change_pct"] == pytest.approx(-50)
    assert row(record, "b", "peak_memory_gib")["low_pct"] == pytest.approx(-50)  # no spread: a point
    assert row(record, "a", "peak_memory_gib")["change_pct"] == pytest.approx(0)


def test_one_pair_has_no_interval() -> None:
    record = synthetic({"a": ["x", "y"]}, {(0,): [(100, 1)], (1,): [(150, 1)]})
    a = row(record, "a", "tokens_per_s")
    assert (a["change_pct"], a["low_pct"], a["high_pct"], a["pairs"]) == (pytest.approx(50), None, None, 1)


def test_an_interaction_beyond_the_noise_is_reported_and_a_product_is_not() -> None:
    noise = (1.0, 1.01, 0.99)
    both = {(0, 0): 100, (1, 0): 200, (0, 1): 100, (1, 1): 300}  # a's 2x becomes 3x at b=v: +50%
    record = synthetic(GRID, {lv: [(t * n, 1.0) for n in noise] for lv, t in both.items()})
    (found,) = [r for r in record["interactions"] if r["metric"] == "tokens_per_s"]
    assert found["keys"] == ["a", "b"] and found["values"] == ["y", "v"] and found["pairs"] == 3
    assert found["change_pct"] == pytest.approx(50, abs=3)
    assert "+100.0% with b=u" in found["note"] and "with b=v" in found["note"]
    product = {(0, 0): 100, (1, 0): 200, (0, 1): 50, (1, 1): 100}  # effects multiply: no interaction
    record = synthetic(GRID, {lv: [(t * n, 1.0) for n in noise] for lv, t in product.items()})
    assert record["interactions"] == []


def test_pareto_front_holds_the_undominated_cells_with_the_fastest_and_the_leanest() -> None:
    record = synthetic(GRID, {(0, 0): [(100, 1.0)], (1, 0): [(300, 3.0)], (0, 1): [(90, 2.0)],
                              (1, 1): [(200, 1.5)]})
    # cells are numbered first key slowest: (0, 0), (0, 1), (1, 0), (1, 1)
    assert record["pareto"] == [0, 3, 2]  # cell 1 is slower and bigger than cell 0; leanest first


def test_a_partly_run_cell_is_pending_and_off_the_front() -> None:
    record = synthetic(GRID, {(0, 0): [(100, 1.0), (110, 1.0)], (1, 0): [(300, 0.5)], (0, 1): [(100, 1.0)] * 2,
                              (1, 1): [(100, 1.0)] * 2})
    assert record["cells"][2]["status"] == "pending" and 2 not in record["pareto"]
    assert sweep.todo(record) == [(2, 1)]
    assert record["cells"][0]["tokens_per_s"] == {"median": 105, "low": 100, "high": 110}


def test_repeats_interleave() -> None:
    record = synthetic({"a": ["x", "y", "z"]}, {})
    record["spec"]["repeats"] = 2
    assert sweep.todo(record) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]


def test_the_tables_for_people(capsys: pytest.CaptureFixture) -> None:
    noise = (1.0, 1.01, 0.99)
    both = {(0, 0): 100, (1, 0): 200, (0, 1): 100, (1, 1): 300}
    record = synthetic(GRID, {lv: [(t * n, 1.0 + lv[0]) for n in noise] for lv, t in both.items()})
    record.update(id="s1", refused=[{"settings": {"a": "z", "b": "u"}, "reason": "switches.x: cannot run here"}])
    print_sweep(record, Path("sweeps/s1/sweep.json"), sys.stdout)
    out = capsys.readouterr().out
    assert "     3  a=y b=v   done     300 [297-303]" in out
    assert "a=y vs x: throughput +144.9% [" in out and "(6 pairs)" in out
    assert "a=y changes throughput by +100.0% with b=u but by +200.0% with b=v (+50.0%" in out
    assert "leanest first: cell 0, 1, 3" in out and "refused: a=z b=u: switches.x: cannot run here" in out


# --- real sweeps on tiny ----------------------------------------------------------------------------------------

def stored_runs(runs_dir: Path) -> list[Path]:
    return sorted(p.parent for p in runs_dir.glob("*/run.json"))


def only_record(runs_dir: Path) -> dict[str, Any]:
    ((_, record),) = records.list_all(runs_dir, "sweep")
    return record


def test_a_malformed_grid_exits_2_in_one_line(tmp_path: Path) -> None:
    proc = glmperf("sweep", "--preset", "tiny", "--grid", "switches.amp=bf16", "--runs-dir", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "needs at least 2 distinct values" in proc.stderr


def test_every_cell_refused_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["sweep", "--preset", "tiny", "--grid", "switches.memory_fraction=0.5,0.6", "--runs-dir",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every one of the 2 cells" in err and "memory_fraction caps CUDA memory" in err
    assert stored_runs(tmp_path) == []


@pytest.mark.slow
def test_a_2x2_grid_stores_4_runs_the_ablation_and_the_pareto_front(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    args = ["sweep", "--preset", "tiny", *FAST, "--grid", "switches.amp=off,bf16", "--grid", "train.batch_size=2,8",
            "--steps", "12", "--runs-dir", str(tmp_path), "--no-progress"]
    assert main([*args, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert tuple(record) == KEYS and record["status"] == "completed" and record == only_record(tmp_path)
    runs = stored_runs(tmp_path)
    assert len(runs) == 4 and all(c["status"] == "done" and len(c["runs"]) == 1 for c in record["cells"])
    # the figures again, straight from the stored runs
    figures: dict[int, dict[str, float]] = {}
    for run_dir in runs:
        run = load_run(run_dir)
        link = run.record["sweep"]
        assert run.status == "completed" and link["id"] == record["id"] and link["repeat"] == 0
        summary = summary_of(run)
        figures[link["cell"]] = {"tokens_per_s": METRIC_BY_NAME["tokens_per_s"].value(summary),
                                 "peak_memory_gib": METRIC_BY_NAME["peak_memory"].value(summary)}
    for cell in record["cells"]:
        assert cell["tokens_per_s"]["median"] == pytest.approx(figures[cell["index"]]["tokens_per_s"])
        assert cell["peak_memory_gib"]["median"] == pytest.approx(figures[cell["index"]]["peak_memory_gib"])
    # cells: amp=off batch 2, off 8, bf16 2, bf16 8; amp's effect pairs cell 2 with 0 and 3 with 1
    amp = row(record, "switches.amp", "tokens_per_s")
    ratios = [figures[2]["tokens_per_s"] / figures[0]["tokens_per_s"],
              figures[3]["tokens_per_s"] / figures[1]["tokens_per_s"]]
    assert amp["pairs"] == 2 and amp["change_pct"] == pytest.approx(100 * (math.sqrt(ratios[0] * ratios[1]) - 1))
    assert amp["low_pct"] <= amp["change_pct"] <= amp["high_pct"]
    assert {(r["key"], r["metric"]) for r in record["ablation"]} == {
        (k, m) for k in ("switches.amp", "train.batch_size") for m in ("tokens_per_s", "peak_memory_gib")}
    fastest = max(figures, key=lambda i: figures[i]["tokens_per_s"])
    leanest = min(figures, key=lambda i: figures[i]["peak_memory_gib"])
    assert {fastest, leanest} <= set(record["pareto"])
    for i in record["pareto"]:  # nothing on the front is beaten on both
        assert not any(f["tokens_per_s"] > figures[i]["tokens_per_s"] and
                       f["peak_memory_gib"] < figures[i]["peak_memory_gib"] for f in figures.values())
    # the same sweep again: complete, so a new one (the tables for people this time)
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "is complete: starting a new one" in err and len(stored_runs(tmp_path)) == 8
    assert "ablation:" in out and "switches.amp=bf16 vs off: throughput" in out and "pareto front" in out


@pytest.mark.slow
def test_refused_cells_are_listed_with_the_reason_and_the_rest_run(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    assert main(["sweep", "--preset", "tiny", *FAST, "--grid", "switches.attention=sdpa,linear", "--grid",
                 "data.objective=causal,blank_infilling", "--steps", "6", "--runs-dir", str(tmp_path),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    record = only_record(tmp_path)
    (refused,) = record["refused"]
    assert refused["settings"] == {"switches.attention": "linear", "data.objective": "blank_infilling"}
    assert refused["reason"].startswith("switches.attention: linear attention is causal only")
    assert len(record["cells"]) == 3 and len(stored_runs(tmp_path)) == 3
    assert "refused: switches.attention=linear data.objective=blank_infilling: switches.attention: linear" in out


def wait_until(check: Any, timeout: float = 180) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not reached in {timeout}s")


def training(run_dir: Path) -> bool:
    """The run is live and has flushed 2 steps (False while its files change under the reader)."""
    try:
        return store.read_run(run_dir)["status"] == "running" and len(store.read_table(run_dir, "steps")) >= 2
    except (store.StoreError, OSError):
        return False


def completed_runs(record: dict[str, Any]) -> set[str]:
    return {a["run"] for c in record["cells"] for a in c["attempts"] if a["status"] == "completed"}


@pytest.mark.slow
def test_an_interrupted_sweep_restarted_runs_nothing_done_again(tmp_path: Path) -> None:
    # a slow reader (50 ms a batch) keeps each cell training for 2 s or more, however fast the machine,
    # so the Ctrl-C below lands inside a cell
    args = ["sweep", "--preset", "tiny", *FAST, "--set=data.io_delay_ms=50", "--grid", "switches.amp=off,bf16",
            "--grid", "train.batch_size=2,4", "--steps", "40", "--runs-dir", str(tmp_path), "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from profiler.cli import main; sys.exit(main())",
                             *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def first_cell_stored() -> bool:
            plans = records.list_all(tmp_path, "sweep")
            return bool(plans and completed_runs(plans[0][1]))

        def alive(check: Any) -> Any:
            assert proc.poll() is None, proc.communicate()
            return check()

        wait_until(lambda: alive(first_cell_stored))
        # Ctrl-C while the second cell trains (it has flushed steps)
        wait_until(lambda: alive(lambda: any(training(r) for r in stored_runs(tmp_path))))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    record = only_record(tmp_path)
    done = completed_runs(record)
    assert record["status"] == "interrupted" and 1 <= len(done) < 4
    assert f"sweep {record['id']}: interrupted" in out
    before = stored_runs(tmp_path)
    again = glmperf(*args)
    assert again.returncode == 0, again.stderr
    assert f"resuming sweep {record['id']}: {len(done)} of 4 runs done" in again.stderr
    record = only_record(tmp_path)
    assert record["status"] == "completed" and done <= completed_runs(record) and len(completed_runs(record)) == 4
    assert len(stored_runs(tmp_path)) == len(before) + 4 - len(done)  # nothing done ran again
