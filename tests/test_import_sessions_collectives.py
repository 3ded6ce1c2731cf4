"""A worker's several profiling sessions import as one rank; collective kernels that do not name their
collective (NCCL 2.19+'s and RCCL's `ncclDevKernel_Generic`) are timed as the collective that launched them.

Sessions: the TensorBoard plugin's ResNet-50 sample profiled one worker twice (tests/data/traces_public/
tb_plugin_resnet50: steps #5-#10, then #16-#21 470 s later, a file each). Read as two ranks they made a
world of two, a false straggler and no step both "ranks" had; the import refused them since. Now they are
one rank with both sessions' steps, and its figures are each session's combined.

Generic kernels: TraceLens's MI300X DDP trace (RCCL 2.22.3: every collective kernel `ncclDevKernel_Generic`)
and the shared A100 DDP trace with its NCCL kernels renamed so in a copy, which is how NCCL 2.19+ writes
them: named kernels timed the collectives, generic ones all went to send_recv and left the all-reduce NaN.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import re
from pathlib import Path
from typing import Any

import pytest

from profiler import store
from profiler.advice import diagnose as d
from profiler.analysis import load_run
from profiler.cli import main
from profiler.traces import collectives
from profiler.traces.reader import read_trace
from profiler.traces.steps import step_rows
from profiler.traces.summary import analyze_traces
from tests.test_diagnose_rules import figures

PUBLIC = Path(__file__).parent / "data" / "traces_public"
FIRST = PUBLIC / "tb_plugin_resnet50" / "num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
SECOND = PUBLIC / "tb_plugin_resnet50" / "num_workers_0_second_session" / "worker0.1623143566756.pt.trace.json.gz"
RCCL = PUBLIC / "tracelens_mi300_resnet_rccl" / "resnet_act_checkpoint.json.gz"
SHARED = Path("/work/shared/data/traces")
NEEDS_SHARED = pytest.mark.skipif(not SHARED.is_dir(), reason="the shared traces are not on this machine")


def _linked(directory: Path, files: dict[str, Path]) -> Path:
    directory.mkdir()
    for name, target in files.items():
        (directory / name).symlink_to(target)
    return directory


@pytest.fixture(scope="module")
def two_sessions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The sample's two sessions imported from one directory: the run and what `glmperf import` printed."""
    root = tmp_path_factory.mktemp("sessions")
    traces = _linked(root / "traces", {FIRST.name: FIRST, SECOND.name: SECOND})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["import", str(traces), "--runs-dir", str(root / "runs")]) == 0
    (run,) = store.list_runs(root / "runs")
    return Path(run["path"]), out.getvalue()


@pytest.fixture(scope="module")
def alone() -> list[dict[str, Any]]:
    """Each session imported by itself: rank 0's figures."""
    return [analyze_traces([path]).per_rank[0] for path in (FIRST, SECOND)]


def test_two_sessions_of_one_worker_are_one_rank_with_both_windows_of_steps(two_sessions: tuple[Path, str]) -> None:
    run_dir, printed = two_sessions
    run = load_run(run_dir)
    assert run.record["world_size"] == 1 and list(run.record["import"]["files"]) == ["0"]
    names = [FIRST.name, SECOND.name]
    assert [Path(f).name for f in run.record["import"]["sessions"]["0"]] == names
    assert f"rank 0: 2 profiling sessions of one worker, read as one rank ({FIRST.name}, {SECOND.name})" in printed
    assert sorted(run.steps["step"]) == [*range(5, 11), *range(16, 22)] and set(run.steps["rank"]) == {0}
    assert run.record["summary"]["steps_counted"] == 12
    trace = run.record["summary"]["trace"]
    assert list(trace["ranks"]) == ["0"] and not trace.get("stragglers")
    assert [Path(f).name for f in trace["ranks"]["0"]["sessions"]] == names
    skipped = {s["rule"]: s["reason"] for s in run.diagnosis["skipped"]}
    assert skipped.get("comm_bound") == "one rank: nothing is communicated"  # and one rank it is
    assert "straggler" not in [b["kind"] for b in run.diagnosis["bottlenecks"]]


def _weighted(sessions: list[dict[str, Any]], group: str | None, key: str, weight: str) -> float:
    """`key` of the sessions (in `group`), weighted by `weight` (in `group` too where it is a total there)."""
    def of(f: dict[str, Any], name: str) -> float:
        return float(f[group][name]) if group and name in f[group] else float(f[name])
    return sum(of(f, key) * of(f, weight) for f in sessions) / sum(of(f, weight) for f in sessions)


def test_the_ranks_figures_are_each_sessions_combined(two_sessions: tuple[Path, str],
                                                       alone: list[dict[str, Any]]) -> None:
    both = store.read_run(two_sessions[0])["summary"]["trace"]["ranks"]["0"]
    assert both["steps"] == 12 and both["window_steps"] == sum(f["window_steps"] for f in alone) == 10
    for group, total in (("temporal", "gpu_time_s"), ("kernels", "kernel_time_s"), ("idle", "idle_time_s")):
        assert both[group][total] == pytest.approx(sum(f[group][total] for f in alone))
        for key in set(alone[0][group]) - {total}:
            assert both[group][key] == pytest.approx(_weighted(alone, group, key, total)), (group, key)
    assert both["launches"] == sum(f["launches"] for f in alone)
    assert both["short_kernel_share"] == pytest.approx(_weighted(alone, None, "short_kernel_share", "launches"))
    assert both["launch_delay_us"]["p50"] == pytest.approx(_weighted(alone, "launch_delay_us", "p50", "launches"))


def test_the_tables_sum_the_sessions(two_sessions: tuple[Path, str]) -> None:
    run = load_run(two_sessions[0])
    sessions = [analyze_traces([path]) for path in (FIRST, SECOND)]
    for table, keys in (("kernels", ["name"]), ("ops", ["name", "input_shapes"])):
        rows = getattr(run, table)
        assert len(rows) == len(rows.drop_duplicates(keys))  # one row a name, not one a session
        assert rows["calls"].sum() == sum(s.table(table)["calls"].sum() for s in sessions)
        assert set(rows["steps"]) == {12}
    assert run.kernels["time_s"].sum() == pytest.approx(sum(s.table("kernels")["time_s"].sum() for s in sessions))


def test_sessions_numbered_alike_are_renumbered_and_identical_ones_change_no_share(
        tmp_path: Path, alone: list[dict[str, Any]]) -> None:
    # two profile() blocks each count from the same step: the second session's steps follow the first's
    traces = _linked(tmp_path / "traces", {FIRST.name: FIRST, "worker0.1623143099999.pt.trace.json.gz": FIRST})
    analyzed = analyze_traces(sorted(traces.iterdir()))
    assert list(analyzed.per_rank) == [0]
    assert sorted(analyzed.table("steps")["step"]) == list(range(5, 17))
    twice, once = analyzed.per_rank[0], alone[0]
    assert twice["temporal"]["idle_share"] == pytest.approx(once["temporal"]["idle_share"])
    assert twice["temporal"]["gpu_time_s"] == pytest.approx(2 * once["temporal"]["gpu_time_s"])


def _kinds(path: Path) -> dict[str, Any]:
    trace = read_trace(path)
    return collectives.analyze(trace, len(step_rows(trace, 0)))


def test_rccl_generic_kernels_are_timed_as_the_all_reduce_and_broadcast_that_launched_them() -> None:
    found = _kinds(RCCL)
    assert set(found["kinds"]) == {"all_reduce", "broadcast"}  # no send_recv: the job sends nothing
    # each kernel names its collective in its args, the more direct source than the operator around its launch
    assert found["kernels_by"]["kernel_name"] == 0 and found["kernels_by"]["collective_name"] > 0
    reduce, broadcast = found["kinds"]["all_reduce"], found["kinds"]["broadcast"]
    assert 0 < reduce["exposed_s"] <= reduce["time_s"] < found["step_s"]
    assert 0 < broadcast["time_s"] < reduce["time_s"]


def _generic(source: Path, target: Path) -> Path:
    """A copy of `source` with every NCCL kernel named as NCCL 2.19+ names it."""
    raw = gzip.decompress(source.read_bytes())
    target.write_bytes(re.sub(rb'"name": ?"ncclKernel_[^"]*"', b'"name": "ncclDevKernel_Generic(ncclDevKernelArgs)"',
                              raw))
    return target


@NEEDS_SHARED
def test_generic_kernels_give_the_times_the_named_kernels_gave(tmp_path: Path) -> None:
    source = SHARED / "a100_2rank_nccl" / "rank-0.json.gz"
    named, generic = _kinds(source), _kinds(_generic(source, tmp_path / "rank-0.json"))
    assert set(generic["kinds"]) == set(named["kinds"]) == {"all_reduce", "broadcast"}
    for kind in named["kinds"]:
        for key in ("time_s", "exposed_s", "calls"):
            assert generic["kinds"][kind][key] == pytest.approx(named["kinds"][kind][key]), (kind, key)
    assert generic["kernels_by"] == named["kernels_by"] and generic["kernels_by"]["kernel_name"] == 0


@NEEDS_SHARED
def test_send_recv_kernels_of_other_collectives_are_not_send_recv() -> None:
    # this job's NCCL ran its all-to-all, reduce-scatter, all-gather and all-reduce as SendRecv kernels
    found = _kinds(SHARED / "a100_16rank" / "rank-0.json.gz")
    assert "send_recv" not in found["kinds"]
    assert all(not math.isnan(kind["time_s"]) for kind in found["kinds"].values()), found["kinds"]


def test_the_gpu_comm_verdict_gives_each_kind_as_a_part_of_the_exposed_time() -> None:
    # the kinds are shares of the step, the total of the GPU's time: the message gives the kinds' parts
    f = figures(comm_exposed=64.8, comm_overlap=10.0, comm_exposed__all_reduce=60.0, comm_exposed__broadcast=20.0)
    (finding,) = [b for b in d.diagnose(f)["bottlenecks"] if b["kind"] == "comm_bound"]
    assert finding["message"] == ("64.8% of the GPU's time is NCCL communication no computation overlaps "
                                  "(10% of it overlapped); of that exposed time: all_reduce 75.0%, broadcast 25.0%")
