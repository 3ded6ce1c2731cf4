"""Collectives' payload bytes and process groups from the args PyTorch records on each NCCL kernel and
`record_param_comms` event (profiler.traces.comm_args), on real traces: the shared A100 DDP trace, whose
operators record no shapes (its bytes were unknown), TraceLens's MI300X trace (2 of its group's 8 ranks
imported), and copies of the A100 one edited as a job with two process groups writes them, or with the
args taken out, as older PyTorch writes it."""

from __future__ import annotations

import contextlib
import gzip
import io
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks.import_ranks import tile_ranks
from profiler import store
from profiler.analysis import load_run
from profiler.cli import main
from profiler.traces import blocks, collective_skew, collectives, comm_args, reader
from profiler.traces.reader import read_trace
from profiler.traces.steps import step_rows
from profiler.traces.summary import Analyzed, analyze_traces

A100 = Path("/work/shared/data/traces/a100_2rank_nccl/rank-0.json.gz")
RCCL = Path(__file__).parent / "data" / "traces_public" / "tracelens_mi300_resnet_rccl" / \
    "resnet_act_checkpoint.json.gz"
NEEDS_SHARED = pytest.mark.skipif(not A100.exists(), reason="the shared traces are not on this machine")
ITEMSIZE = {"Float": 4, "Long": 8, "BFloat16": 2}
"""The dtypes these traces' collectives name, in bytes."""
KIND = {"allreduce": "all_reduce", "broadcast": "broadcast"}
ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "In split size",
        "Out split size", "Process Group Name", "Process Group Description", "Process Group Ranks")
DELAY_US = 20_000.0
TP = {"Process Group Name": "1", "Process Group Description": "tp", "Process Group Ranks": "[0, 1, 2, 3]",
      "Group size": 4}
"""The second group of the edited A100 trace: a tensor-parallel group of 4 ranks, 2 of them imported."""


def _events(path: Path) -> list[dict[str, Any]]:
    return [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]


def _rewrite(path: Path, change: Callable[[list[dict[str, Any]]], None]) -> None:
    trace = orjson.loads(gzip.decompress(path.read_bytes()))
    change(trace["traceEvents"])
    path.write_bytes(gzip.compress(orjson.dumps(trace), compresslevel=1))


def _nccl_kernels(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The NCCL kernels in time order."""
    return sorted((e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")),
                  key=lambda e: e["ts"])


def _payload(args: dict[str, Any]) -> float:
    """By hand: an all-reduce's or broadcast's bytes, its input's elements times its dtype's size."""
    return float(args["In msg nelems"] * ITEMSIZE[args["dtype"]])


@NEEDS_SHARED
def test_the_a100_collectives_have_the_bytes_their_kernels_args_give() -> None:
    trace = read_trace(A100)
    steps = len(step_rows(trace, 0))
    found, calls = collectives.analyze_calls(trace, steps)
    kernels = _nccl_kernels(_events(A100))
    assert kernels and all("Collective name" in k["args"] for k in kernels)
    by_hand: dict[str, float] = defaultdict(float)
    for kernel in kernels:
        by_hand[KIND[kernel["args"]["Collective name"]]] += _payload(kernel["args"])
        (call,) = calls.index[(calls["start_us"] + trace.base_us - kernel["ts"]).abs() < 1e-3]
        assert calls.at[call, "bytes"] == _payload(kernel["args"])
        assert calls.at[call, "group"] == "0" and calls.at[call, "group_size"] == 2
    assert set(found["kinds"]) == set(by_hand) == {"all_reduce", "broadcast"}
    for kind, total in by_hand.items():
        assert found["kinds"][kind]["bytes"] == pytest.approx(total / steps, rel=1e-12), kind


def _not_fast(*_: object) -> dict[str, Any]:
    raise blocks.NotFast


@pytest.mark.parametrize(("name", "kind"), [
    ("allreduce", "all_reduce"), ("allreduce_coalesced", "all_reduce"), ("_allgather_base", "all_gather"),
    ("all_gather_into_tensor_coalesced", "all_gather"), ("_reduce_scatter_base", "reduce_scatter"),
    ("all_to_allv", "all_to_all"), ("broadcast", "broadcast"), ("recvAnySource", "send_recv"),
    ("barrier", None), ("reduce", None), ("wait", None)])
def test_c10d_s_collective_names_give_their_kinds(name: str, kind: str | None) -> None:
    assert comm_args.kind(name) == kind


@NEEDS_SHARED
def test_an_all_gather_counts_its_output_and_a_reduce_scatter_its_input(tmp_path: Path) -> None:
    def gathered_and_scattered(events: list[dict[str, Any]]) -> None:
        first, second = (k["args"] for k in _nccl_kernels(events)[:2])
        first.update({"Collective name": "_allgather_base", "Out msg nelems": 2 * first["In msg nelems"]})
        second.update({"Collective name": "_reduce_scatter_base", "Out msg nelems": second["In msg nelems"] // 2})

    (path,) = tile_ranks(A100, tmp_path, 1)
    _rewrite(path, gathered_and_scattered)
    first, second = (k["args"] for k in _nccl_kernels(_events(path))[:2])
    found = comm_args.described(read_trace(path).comms)
    edited = found[found["kind"].isin(["all_gather", "reduce_scatter"])]
    assert sorted(zip(edited["kind"], edited["bytes"], strict=True)) == [
        ("all_gather", first["Out msg nelems"] * ITEMSIZE[first["dtype"]]),
        ("reduce_scatter", second["In msg nelems"] * ITEMSIZE[second["dtype"]])]


@pytest.mark.parametrize("parser", ["msgspec", "orjson", "streaming"])
def test_every_parser_keeps_the_collective_events_args_alone(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = read_trace(RCCL)
    if parser == "orjson":
        monkeypatch.setattr(blocks, "_DECODER", None)
    elif parser == "streaming":
        monkeypatch.setattr(reader, "_fast_read", _not_fast)
    trace = read_trace(RCCL)
    named = [e for e in _events(RCCL) if "Collective name" in e.get("args", {})]
    assert len(trace.comms) == len(named) > 0 and trace.comms.equals(fast.comms)
    rows = trace.comms["row"].to_numpy()
    assert sorted(trace.names[code] for code in trace.events["name"].to_numpy()[rows]) == \
        sorted(e["name"] for e in named)
    assert sorted(trace.comms["in_nelems"]) == sorted(e["args"]["In msg nelems"] for e in named)
    assert set(trace.comms["pg_name"]) == {"0"} and "[0, 1, 2, 3, 4, 5, 6, 7]" in set(trace.comms["pg_ranks"])


@pytest.fixture(scope="module")
def rccl_pair(tmp_path_factory: pytest.TempPathFactory) -> Analyzed:
    return analyze_traces(tile_ranks(RCCL, tmp_path_factory.mktemp("rccl"), 2))


def test_bus_bandwidth_takes_n_from_the_group_size_not_the_ranks_imported(rccl_pair: Analyzed) -> None:
    across = rccl_pair.summary()["collectives_across_ranks"]
    assert across["groups_from"] == "process_group"
    group = next(g for g in across["groups"] if g["name"] == "0")
    assert (group["description"], group["ranks"], group["size"]) == ("default_pg", list(range(8)), 8)
    assert group["kinds"]["all_reduce"]["ranks"] == 2
    rows = collective_skew.matched(rccl_pair.calls, "all_reduce", "0")
    first = next(k for k in _nccl_kernels(_events(RCCL)) if k["args"].get("Collective name") == "allreduce")
    algbw = _payload(first["args"]) / first["dur"] / 1e3  # bytes per us / 1e3: GB/s
    call = rows.iloc[0]
    # this trace records the shapes too, and its bytes are theirs: the args give the same
    assert call["algbw_gb_s"] == pytest.approx(algbw, rel=1e-6) and call["group_size"] == 8
    assert call["busbw_gb_s"] == pytest.approx(algbw * 2 * (8 - 1) / 8, rel=1e-6)  # all_reduce's 2(n-1)/n


def _relabel(events: list[dict[str, Any]], delay_us: float = 0.0) -> None:
    """Every other all-reduce kernel (in time order) as the TP group's, started `delay_us` later."""
    reduces = [k for k in _nccl_kernels(events) if k["args"]["Collective name"] == "allreduce"]
    for kernel in reduces[1::2]:
        kernel["args"].update(TP)
        kernel["ts"] += delay_us


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """The A100 trace as two ranks whose all-reduces alternate between the data-parallel group and TP, rank 1
    arriving DELAY_US late at TP's only, imported by `glmperf import`: the stored summary.trace, the output."""
    root = tmp_path_factory.mktemp("groups")
    first, second = tile_ranks(A100, root, 2)
    _rewrite(first, _relabel)
    _rewrite(second, lambda events: _relabel(events, DELAY_US))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["import", str(root), "--runs-dir", str(root / "runs"), "--workers", "1"]) == 0
    (run,) = store.list_runs(root / "runs")
    return load_run(Path(run["path"])).stored_summary["trace"], out.getvalue()


@NEEDS_SHARED
def test_two_process_groups_are_matched_and_reported_apart(two_groups: tuple[dict[str, Any], str]) -> None:
    across = two_groups[0]["collectives_across_ranks"]
    assert across["groups_from"] == "process_group"
    dp, tp = across["groups"]
    assert (dp["name"], dp["description"], dp["ranks"], dp["size"]) == ("0", "default_pg", [0, 1], 2)
    assert (tp["name"], tp["description"], tp["ranks"], tp["size"]) == ("1", "tp", [0, 1, 2, 3], 4)
    assert set(dp["kinds"]) == {"all_reduce", "broadcast"} and set(tp["kinds"]) == {"all_reduce"}
    ours, theirs = dp["kinds"]["all_reduce"], tp["kinds"]["all_reduce"]
    assert (ours["calls"], theirs["calls"], ours["unmatched"], theirs["unmatched"]) == (8, 7, 0, 0)
    # rank 1 is late at TP's all-reduces only: matched by kind alone, the two groups' calls would pair up wrong
    assert ours["skew_ms"]["max"] == 0 and ours["last"] is None
    assert theirs["skew_ms"]["p50"] == pytest.approx(DELAY_US / 1e3, abs=1e-3)
    assert theirs["last"] == {"rank": 1, "calls": 7, "of": 7}
    assert ours["busbw_gb_s"] == pytest.approx(ours["algbw_gb_s"])  # n = 2: 2(n-1)/n = 1
    assert theirs["busbw_gb_s"] == pytest.approx(1.5 * theirs["algbw_gb_s"])  # n = 4: 2(n-1)/n = 1.5


@NEEDS_SHARED
def test_the_import_prints_each_group_by_name(two_groups: tuple[dict[str, Any], str]) -> None:
    printed = two_groups[1]
    assert "process group 0 (default_pg): 2 ranks [0, 1]" in printed
    assert "process group 1 (tp): 4 ranks [0, 1, 2, 3]" in printed
    assert "no process group" not in printed


def _strip(events: list[dict[str, Any]]) -> None:
    for event in events:
        for key in ARGS:
            event.get("args", {}).pop(key, None)


@NEEDS_SHARED
def test_a_trace_without_the_args_keeps_the_figures_it_had(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "stripped").mkdir()
    plain = analyze_traces(tile_ranks(A100, tmp_path / "plain", 2)).summary()
    files = tile_ranks(A100, tmp_path / "stripped", 2)
    for path in files:
        _rewrite(path, _strip)
    stripped = analyze_traces(files).summary()
    before, after = stripped["ranks"]["0"]["collectives"], plain["ranks"]["0"]["collectives"]
    assert before["kernels_by"] == {"collective_name": 0, "host_operator": 14, "kernel_name": 0}
    assert after["kernels_by"] == {"collective_name": 14, "host_operator": 0, "kernel_name": 0}
    for kind, figures in before["kinds"].items():
        assert math.isnan(figures["bytes"]) and not math.isnan(after["kinds"][kind]["bytes"])
        for key in ("calls", "time_s", "exposed_s"):
            assert figures[key] == after["kinds"][kind][key], (kind, key)
    across = stripped["collectives_across_ranks"]
    assert across["groups_from"] == "ranks"
    (group,) = across["groups"]
    assert (group["name"], group["description"], group["ranks"], group["size"]) == (None, None, [0, 1], 2)
    (named,) = plain["collectives_across_ranks"]["groups"]
    for kind, figures in group["kinds"].items():
        assert figures["busbw_gb_s"] is None  # no payload bytes, as before
        for key in ("ranks", "calls", "unmatched", "skew_ms", "time_s", "waiting_s"):
            assert figures[key] == named["kinds"][kind][key], (kind, key)
