"""Collectives matched across ranks (profiler.traces.collective_skew) on a real trace: the shared 16-rank A100
job's rank 0 (all-to-alls with their payload shapes recorded), its first two steps tiled as two ranks.

As tiled, both ranks start every collective at once: no rank is last and no straggler is named. Delayed,
rank 1's every event is DELAY_US later and rank 0's NCCL kernels DELAY_US longer (it waits for rank 1 inside
them, as a rank that arrives early does): rank 1 is named, late by DELAY_US in each call, and the waiting
is rank 0's extra time. The shared traces hold one rank of each job, so a job's ranks are copies of it."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from benchmarks.import_ranks import tile_ranks
from profiler import store
from profiler.analysis import load_run
from profiler.cli import main
from profiler.traces import collective_skew
from profiler.traces.collectives import ITEMSIZE
from profiler.traces.summary import Analyzed, analyze_traces

SOURCE = Path("/work/shared/data/traces/a100_16rank/rank-0.json.gz")
STEPS = 2
DELAY_US = 20_000.0
"""20 ms: about 9% of the trace's 216 ms step, over SKEW_OF_STEP (5%)."""
A100_NVLINK_GB_S = 300.0

pytestmark = pytest.mark.skipif(not SOURCE.exists(), reason="the shared traces are not on this machine")


def _rewrite(path: Path, change: Any) -> None:
    trace = orjson.loads(gzip.decompress(path.read_bytes()))
    for event in trace["traceEvents"]:
        change(event)
    path.write_bytes(gzip.compress(orjson.dumps(trace), compresslevel=1))


def _nccl_kernel(event: dict[str, Any]) -> bool:
    return event.get("cat") == "kernel" and event.get("name", "").startswith("nccl")


def _later(event: dict[str, Any]) -> None:
    event["ts"] += DELAY_US


def _waits(event: dict[str, Any]) -> None:
    if _nccl_kernel(event):
        event["dur"] += DELAY_US


@pytest.fixture(scope="module")
def balanced(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Analyzed]:
    files = tile_ranks(SOURCE, tmp_path_factory.mktemp("balanced"), 2, steps=STEPS)
    return files, analyze_traces(files)


@pytest.fixture(scope="module")
def delayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The delayed pair imported by `glmperf import`: the run's directory and what the command printed."""
    root = tmp_path_factory.mktemp("delayed")
    first, second = tile_ranks(SOURCE, root, 2, steps=STEPS)
    _rewrite(first, _waits)
    _rewrite(second, _later)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["import", str(root), "--runs-dir", str(root / "runs"), "--workers", "1"]) == 0
    (run,) = store.list_runs(root / "runs")
    return Path(run["path"]), out.getvalue()


def test_every_call_is_matched_across_the_ranks_with_sane_figures(balanced: tuple[list[Path], Analyzed]) -> None:
    summary = balanced[1].summary()
    across = summary["collectives_across_ranks"]
    json.dumps(across, allow_nan=False)
    assert across["groups_from"] == "ranks"  # this trace's kernels name no process group
    (group,) = across["groups"]
    assert (group["name"], group["ranks"], group["size"]) == (None, [0, 1], 2)
    assert "all_to_all" in group["kinds"] and "straggler" not in across
    for k in group["kinds"].values():
        assert k["ranks"] == 2 and k["calls"] > 0 and k["unmatched"] == 0
        assert k["skew_ms"]["p50"] == k["skew_ms"]["max"] == 0 and k["last"] is None  # the same trace twice
        assert k["waiting_share"] == 0
        assert k["link_peak_gb_s"] == A100_NVLINK_GB_S
    a2a = group["kinds"]["all_to_all"]
    assert 0 < a2a["busbw_gb_s"] < A100_NVLINK_GB_S and a2a["busbw_of_peak"] == a2a["busbw_gb_s"] / A100_NVLINK_GB_S


def test_one_rank_has_nothing_to_match(balanced: tuple[list[Path], Analyzed]) -> None:
    assert collective_skew.analyze({0: balanced[1].calls[0]}, 0.2, "NVIDIA A100-SXM4-80GB") == {}


def _first_all_to_all_base(path: Path) -> tuple[float, list[dict[str, Any]]]:
    """By hand from the file: the first `c10d::alltoall_base_`'s input bytes (its second argument: earlier
    all-to-alls take tensor lists, which record no shapes) and the kernels launched inside it."""
    events = [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    op = min((e for e in events if e["name"] == "c10d::alltoall_base_"), key=lambda e: e["ts"])
    dims, types = op["args"]["Input Dims"], op["args"]["Input type"]
    payload = float(np.prod(dims[1])) * ITEMSIZE[types[1]]
    launched = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime" and e["tid"] == op["tid"]
                and op["ts"] <= e["ts"] <= op["ts"] + op["dur"] and "correlation" in e.get("args", {})}
    return payload, [e for e in events if _nccl_kernel(e) and e["args"].get("correlation") in launched]


def test_an_all_to_all_s_bus_bandwidth_is_its_bytes_over_its_kernel_time(
        balanced: tuple[list[Path], Analyzed]) -> None:
    files, analyzed = balanced
    payload, kernels = _first_all_to_all_base(files[0])
    assert len(kernels) == 1
    mine = analyzed.calls[0]
    (at,) = mine.index[(mine["start_us"] - kernels[0]["ts"]).abs() < 1]
    calls = collective_skew.matched(analyzed.calls, "all_to_all").set_index(["step", "seq"])
    call = calls.loc[(mine.at[at, "step"], mine.at[at, "seq"])]
    assert call["bytes"] == payload and call["moving_us"] == pytest.approx(kernels[0]["dur"], abs=1e-3)
    by_hand = payload / kernels[0]["dur"] / 1e3 * (2 - 1) / 2  # bytes per us / 1e3: GB/s; all_to_all's (n-1)/n
    assert call["busbw_gb_s"] == pytest.approx(by_hand, rel=1e-6)
    assert call["algbw_gb_s"] == pytest.approx(2 * by_hand, rel=1e-6)


def test_a_late_rank_is_named_with_its_lateness_and_the_others_wait(
        delayed: tuple[Path, str], balanced: tuple[list[Path], Analyzed]) -> None:
    across = load_run(delayed[0]).stored_summary["trace"]["collectives_across_ranks"]
    before = balanced[1].summary()["collectives_across_ranks"]["groups"][0]["kinds"]
    for kind, k in across["groups"][0]["kinds"].items():
        assert k["last"] == {"rank": 1, "calls": k["calls"], "of": k["calls"]}
        assert k["skew_ms"]["p50"] == pytest.approx(DELAY_US / 1e3, abs=1e-3)
        assert k["waiting_s"] == pytest.approx(k["calls"] * DELAY_US / 1e6, rel=1e-6)
        assert k["time_s"] == pytest.approx(before[kind]["time_s"] + k["waiting_s"], rel=1e-6)
        assert 0 < k["waiting_share"] < 1
        busbw = before[kind]["busbw_gb_s"]  # the moving time is rank 1's, as it was; None: calls without bytes
        assert k["busbw_gb_s"] == (None if busbw is None else pytest.approx(busbw, rel=1e-6))
    s = across["straggler"]
    assert s["rank"] == 1 and s["last_share"] == 1 and s["calls"] >= collective_skew.MIN_CALLS and s["group"] is None
    assert s["skew_ms"] == pytest.approx(DELAY_US / 1e3, abs=1e-3)
    assert not math.isnan(s["skew_ms"])


def test_import_and_show_print_the_section_and_name_the_straggler(delayed: tuple[Path, str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, printed = delayed
    assert main(["show", str(run_dir)]) == 0
    shown = capsys.readouterr().out
    for text in (printed, shown):
        assert "collectives across ranks" in text and "all_to_all" in text
        assert "straggler: rank 1 arrived last in 100% of" in text and "median 20.0 ms after the first" in text


def test_the_diagnosis_names_the_rank_the_others_wait_for(delayed: tuple[Path, str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # rank 1's steps are as long as rank 0's (every event of it moved alike): only its lateness shows
    capsys.readouterr()
    assert main(["diagnose", str(delayed[0]), "--json"]) == 0
    found = {b["kind"]: b for b in json.loads(capsys.readouterr().out)["bottlenecks"]}
    assert "rank 1 arrives last at its all_to_all calls (100% of" in found["straggler"]["message"]
    assert "median 20.0 ms after the first" in found["straggler"]["message"]
