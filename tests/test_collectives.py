"""Communication by collective: the traces of real fsdp, tp and pp runs on 2 gloo ranks give each kind's
calls, payload bytes, time and exposed time; the bytes are what `glmperf plan` computes, and a pipeline's
wait for its neighbour is found and answered with more micro-batches. NCCL traces: time from the kernels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.diagnosis_scenarios import Scenario, run
from profiler.advice.plan import plan
from profiler.analysis import load_run
from profiler.cli import main
from profiler.config import build_run_config
from profiler.traces.collectives import KINDS, analyze
from profiler.traces.reader import read_trace
from profiler.traces.steps import step_rows
from reports.report_run import run_report
from tests.test_import_errors import GOOD as A100_TRACE
from tests.test_report_pages import Page, values

LAYOUTS = {"fsdp": ("switches.parallel.fsdp=2",), "tp": ("switches.parallel.tp=2",),
           "sp": ("switches.parallel.tp=2", "switches.parallel.sequence_parallel=true", "switches.amp.dtype=bf16",
                  "switches.activation_checkpointing.mode=full"),
           "pp": ("switches.parallel.pp=2", "data.seq_len=256"),
           "pp-fsdp": ("switches.parallel.pp=2", "switches.parallel.fsdp=2", "switches.parallel.microbatches=4",
                       "switches.amp.dtype=bf16"),
           "dp-tp": ("switches.parallel.tp=2",),
           "interleaved": ("switches.parallel.pp=2", "switches.parallel.schedule=interleaved_1f1b",
                           "switches.parallel.microbatches=2", "switches.amp.dtype=bf16")}
NPROC = {"pp-fsdp": 4, "dp-tp": 4}
"""Ranks of a layout's run (2 unless named): a pipeline of 2 stages, each sharded over 2 ranks; two replicas
of a tp=2 model."""
PRESET = {"interleaved": "small"}
"""A layout's preset where not `tiny`: two chunks per rank need 4 blocks."""
"""The pipeline on 256 tokens: at 64 its steps are near host bound (about 40% of operator time in calls
under 10 us), where more micro-batches are not advised. Sequence parallelism under bf16 and full
checkpointing: its all-gathers and reduce-scatters in two dtypes, and a recompute that stops early. FSDP
on pipeline stages: blocks gathered by every forward until their first backward, gradients reduced once a step,
the stages' boundary in the dtype FSDP gathers. An interleaved pipeline under bf16: fp32 hidden states cross
three boundaries per micro-batch on each rank."""
PLANNED = {"all_gather", "reduce_scatter", "all_reduce", "send_recv"}
"""The kinds `glmperf plan` counts (a loss broadcast or a gradient-norm all-reduce of a few bytes it leaves out)."""


@pytest.fixture(scope="module")
def runs_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    dirs = {name: tmp_path_factory.mktemp(name) for name in LAYOUTS}
    for name, overrides in LAYOUTS.items():
        run(Scenario(name, "", PRESET.get(name, "tiny"), overrides, nproc=NPROC.get(name, 2)), dirs[name], steps=8)
    return {name: next(p for p in d.iterdir() if (p / "run.json").exists()) for name, d in dirs.items()}


@pytest.fixture(scope="module")
def records(runs_dirs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {name: json.loads((path / "run.json").read_text()) for name, path in runs_dirs.items()}


def _collectives(record: dict[str, Any]) -> list[dict[str, Any]]:
    ranks = record["summary"]["trace"]["ranks"]
    assert sorted(ranks) == [str(r) for r in range(record["world_size"])]
    return [ranks[str(r)]["collectives"] for r in range(len(ranks))]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_ranks_collective_bytes_are_what_plan_computes(records: dict, layout: str) -> None:
    record = records[layout]
    planned = plan(build_run_config(record["config"]), record["world_size"]).comm_bytes_per_step
    for measured in _collectives(record):
        assert measured["backend"] == "gloo"
        kinds = measured["kinds"]
        total = sum(k["bytes"] for k in kinds.values())
        for kind in PLANNED:
            if planned[kind]:
                assert kinds[kind]["bytes"] == pytest.approx(planned[kind], rel=0.10), kind
            else:  # what plan leaves out is a few bytes: a loss, a gradient norm
                assert kinds.get(kind, {"bytes": 0.0})["bytes"] < 0.01 * total, kind
        for kind, figures in kinds.items():
            assert kind in KINDS and figures["calls"] > 0
            assert 0 <= figures["exposed_s"] <= figures["time_s"] + 1e-9 < measured["step_s"], kind


@pytest.mark.slow
def test_a_pipelines_sends_in_flight_during_its_compute_are_not_exposed(records: dict) -> None:
    """An interleaved schedule posts its sends and receives on the training thread and computes the next
    chunk while they are in flight (gloo's events span from posting to completion): the thread that holds
    them is still the one computing, so the overlap is hidden, not exposed."""
    for measured in _collectives(records["interleaved"]):
        sends = measured["kinds"]["send_recv"]
        assert sends["exposed_s"] < 0.6 * sends["time_s"]


@pytest.mark.slow
def test_a_pipelines_wait_for_its_neighbour_is_exposed_send_recv_answered_with_more_microbatches(
        records: dict) -> None:
    diagnosis = records["pp"]["diagnosis"]
    figures = diagnosis["figures"]
    (comm,) = [b for b in diagnosis["bottlenecks"] if b["kind"] == "comm_bound"]
    kinds = {k: figures[f"comm_exposed.{k}"]["value"] for k in KINDS if f"comm_exposed.{k}" in figures}
    assert max(kinds, key=kinds.get) == "send_recv"  # 2 stages, 2 micro-batches: a third of the schedule idle
    assert figures["tiny_op_share"]["value"] < 40  # not host bound: more micro-batches may pay
    assert comm["message"].startswith(f"{comm['evidence']['comm_exposed']['value']:.1f}% of the step waits on "
                                      "communication: send_recv")
    (more,) = [r for r in diagnosis["recommendations"] if "switches.parallel.microbatches" in r["set"]]
    assert more["set"] == {"switches.parallel.microbatches": 4}  # twice the default (as many as stages)
    assert more["expected"]["tokens_per_s"]["high"] > 0


@pytest.mark.slow
def test_the_report_shows_each_ranks_collectives(runs_dirs: dict[str, Path], records: dict) -> None:
    bars = Page(run_report(load_run(runs_dirs["pp"]))).sections["communication-by-collective"]["specs"][0]["data"]
    assert [b["name"] for b in bars] == ["time, rank 0", "exposed, rank 0", "time, rank 1", "exposed, rank 1"]
    kinds = records["pp"]["summary"]["trace"]["ranks"]["1"]["collectives"]["kinds"]
    assert values(bars[3]["y"]) == list(kinds)
    assert values(bars[3]["x"]) == pytest.approx([1e3 * k["exposed_s"] for k in kinds.values()])


@pytest.mark.slow
def test_show_prints_each_ranks_collectives(runs_dirs: dict[str, Path], records: dict,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(runs_dirs["fsdp"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    kinds = records["fsdp"]["summary"]["trace"]["ranks"]["1"]["collectives"]["kinds"]
    (gather,) = [line.split() for line in lines if line.split()[:3] == ["rank", "1", "all_gather"]]
    assert float(gather[4]) == pytest.approx(kinds["all_gather"]["bytes"] / 2**20, abs=1e-3)


@pytest.mark.skipif(not A100_TRACE.exists(), reason="the shared traces are not on this machine")
def test_nccl_collectives_take_their_time_from_the_kernels() -> None:
    """A100 DDP trace recorded without shapes: calls and time by kind, bytes from the process group's args
    (tests/test_collective_groups.py computes them by hand)."""
    trace = read_trace(A100_TRACE)
    found = analyze(trace, len(step_rows(trace, 0)))
    assert found["backend"] == "nccl" and set(found["kinds"]) == {"all_reduce", "broadcast"}
    reduce = found["kinds"]["all_reduce"]
    assert reduce["calls"] == 5 and reduce["bytes"] > 0  # no Input Dims in this trace: its args give them
    assert 0 < reduce["exposed_s"] <= reduce["time_s"] < found["step_s"]
