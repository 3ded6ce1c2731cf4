"""glmperf import on real multi-GPU traces (/work/shared/data/traces): HTA parity, steps, diagnose, compare.

The HTA figures are HTA's own results on the same files (tests/data/traces_hta/hta_figures.json,
made by benchmarks/hta_fixtures.py with the HTA version it names); HTA is not needed here. HTA reads
times in whole microseconds, the import at the trace's resolution: the definitions are compared in
HTA's reading (`timing="hta"`), the exact figures against it within what its rounding can move.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profiler import store
from profiler.analysis import load_run
from profiler.capture.import_traces import import_traces
from profiler.cli import main
from profiler.metrics import flatten
from profiler.traces.reader import read_trace
from profiler.traces.summary import analyze_traces
from tests.conftest import ROOT

TRACES = Path("/work/shared/data/traces")
HTA = json.loads((Path(__file__).parent / "data" / "traces_hta" / "hta_figures.json").read_text())
SHARED = sorted(HTA["traces"])

pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason="the shared traces are not on this machine")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every shared trace directory imported once, into one runs directory."""
    runs = tmp_path_factory.mktemp("runs")
    return {name: import_traces(TRACES / name, runs_dir=runs).run_dir for name in SHARED}


def _hta_read(name: str) -> dict[str, dict]:
    """Each rank's figures with times read as HTA reads them (whole microseconds)."""
    return analyze_traces(sorted((TRACES / name).glob("*.json.gz")), timing="hta").summary()["ranks"]


@pytest.mark.parametrize("name", SHARED)
def test_every_share_agrees_with_hta_within_one_point_in_htas_reading(name: str) -> None:
    ranks = _hta_read(name)
    assert set(ranks) == set(HTA["traces"][name])
    for rank, theirs in HTA["traces"][name].items():
        ours = flatten(ranks[rank])
        for key, value in flatten(theirs).items():
            if value is None:  # HTA's NaN: no communication to overlap
                assert ours.get(key) is None, key
            elif "share" in key:
                assert abs(ours[key] - value) * 100 < 1.0, (key, ours[key], value)
            else:  # launch delay (us)
                assert ours[key] == pytest.approx(value, rel=0.01), key


@pytest.mark.parametrize("name", SHARED)
def test_exact_figures_differ_from_htas_reading_only_by_its_rounding(imported: dict[str, Path], name: str) -> None:
    """A trace in whole microseconds reads the same both ways, so HTA's agreement holds for its exact
    figures. Where times have ns digits, HTA's rounding moves each GPU event's start and end by under
    1 us each: the busy time and the span by at most 2 us per event, which bounds each temporal share's
    difference; no event is longer in HTA's reading, so its idle share is never the smaller."""
    exact, hta = store.read_run(imported[name])["summary"]["trace"]["ranks"], _hta_read(name)
    for rank, path in load_run(imported[name]).record["import"]["files"].items():
        trace = read_trace(path)
        on_gpu = trace.events[trace.events["stream"] >= 0]
        if not ((on_gpu["ts"] % 1 == 0) & (on_gpu["dur"] % 1 == 0)).all():
            e, h = exact[rank]["temporal"], hta[rank]["temporal"]
            bound = 2e-6 * len(on_gpu) / e["gpu_time_s"]
            assert 0 <= h["idle_share"] - e["idle_share"] <= bound, (h, e, bound)
            assert all(abs(h[k] - e[k]) <= bound for k in ("compute_share", "non_compute_share")), (h, e, bound)
        else:  # nothing to round: HTA's figures are the same both ways
            ours, in_hta = flatten(exact[rank]), flatten(hta[rank])
            assert {k: ours.get(k) for k in flatten(HTA["traces"][name][rank])} == \
                {k: in_hta.get(k) for k in flatten(HTA["traces"][name][rank])}


@pytest.mark.parametrize("name", SHARED)
def test_step_times_are_the_profiler_step_spans(imported: dict[str, Path], name: str) -> None:
    (path,) = (TRACES / name).glob("*.json.gz")
    with gzip.open(path) as fh:
        events = json.load(fh)["traceEvents"]
    spans = {int(e["name"].split("#")[1]): e["dur"] / 1e6 for e in events
             if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")}
    steps = load_run(imported[name]).steps.set_index("step")
    assert sorted(steps.index) == sorted(spans)
    for step, span in spans.items():
        assert steps.loc[step, "step_s"] == pytest.approx(span, rel=0.01)
    phases = [c for c in steps.columns if c.endswith("_s") and c not in ("step_s", "host_s")]
    assert (steps[phases].sum(axis=1) - steps["step_s"]).abs().max() < 1e-6  # the phases add up to the step
    assert (steps["forward_s"] > 0).all()
    assert (steps["backward_s"] + steps["comm_s"] > 0).all()  # exposed communication is carved out of backward


def test_run_record_tables_and_source(imported: dict[str, Path]) -> None:
    run = load_run(imported["a100_2rank_nccl"])
    assert run.source == "import" and run.status == "completed" and not run.problems
    assert run.record["environment"]["device"] == "cuda"
    assert run.record["import"]["job_world_size"] == 2 and run.record["import"]["failed"] == []
    ops = run.ops
    assert {"rank", "name", "input_shapes", "calls", "self_cpu_s", "cpu_total_s", "self_device_s",
            "device_total_s", "self_cpu_memory_bytes", "self_device_memory_bytes", "flops", "steps"} <= set(ops)
    assert (ops["self_cpu_s"] <= ops["cpu_total_s"] + 1e-9).all()
    # every GPU event is attributed to the operator around its launch call
    assert ops["self_device_s"].sum() == pytest.approx(run.kernels["time_s"].sum(), rel=0.02)
    nccl = run.kernels[run.kernels["kind"] == "communication"]
    assert not nccl.empty and nccl["name"].str.startswith("nccl").all()
    assert run.record["summary"]["tokens_per_s"] is None  # a trace does not know its tokens: stored null


def test_diagnose_finds_host_bound_from_gpu_idle_and_comm_bound_from_exposed_nccl(
        imported: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(imported["a100_2rank_nccl"]), "--json"]) == 0
    host = json.loads(capsys.readouterr().out)
    top = host["bottlenecks"][0]
    assert top["kind"] == "host_bound"
    assert {"gpu_idle", "host_wait", "launch_delay", "short_kernels"} <= set(top["evidence"])
    assert top["evidence"]["gpu_idle"]["value"] == pytest.approx(77.23, abs=0.01)  # HTA's reading: 77.78
    assert main(["diagnose", str(imported["v100_2rank_allreduce"]), "--json"]) == 0
    comm = json.loads(capsys.readouterr().out)
    assert comm["bottlenecks"][0]["kind"] == "comm_bound"
    assert "NCCL" in comm["bottlenecks"][0]["message"]


def test_compare_names_the_operators_and_kernels_that_changed_most(
        imported: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    control, test = imported["diff_pair/control"], imported["diff_pair/test"]
    main(["compare", str(control), str(test), "--format", "json"])
    diff = json.loads(capsys.readouterr().out)["trace_diff"]
    kernels = {r["name"]: r for r in diff if r["kind"] == "kernel"}
    copies = kernels["Memcpy DtoD (Device -> Device)"]  # the test job copies on the device ~250x as often
    assert copies["control_calls"] == pytest.approx(3.0) and copies["test_calls"] > 700
    main(["compare", str(control), str(test)])
    text = capsys.readouterr().out
    assert "trace diff: kernels by count" in text and "Memcpy DtoD" in text
    assert "trace diff: operators by time" in text and "aten::copy_" in text


def test_cli_imports_and_prints_the_gpu_breakdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(TRACES / "a100_2rank_nccl"), "--name", "nccl", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "imported 1 rank(s)" in out and "GPU (HTA's definitions)" in out and "77%" in out  # idle, exact
    assert [r["name"] for r in store.list_runs(tmp_path)] == ["nccl"]


def test_one_trace_file_imports_as_its_directory_does(imported: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (file,) = (TRACES / "v100_training").iterdir()
    assert main(["import", str(file), "--runs-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    (run,) = store.list_runs(tmp_path)
    assert run["name"] == "rank-0" and run["world_size"] == 1
    alone, whole = (flatten(load_run(d).record["summary"]["trace"]) for d in (Path(run["path"]),
                                                                               imported["v100_training"]))
    assert {k: v for k, v in alone.items() if "file" not in k} == {k: v for k, v in whole.items() if "file" not in k}


@pytest.mark.parametrize("name", SHARED)
def test_a_report_of_an_import_has_its_figures_and_says_what_a_trace_lacks(
        imported: dict[str, Path], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert main(["report", str(imported[name]), "-o", str(out)]) == 0, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    assert "Step-time breakdown" in page and "Top operators" in page
    assert "no loss recorded (no step ran, or the run is an imported trace)" in page


def test_the_dashboard_s_run_page_shows_an_import(imported: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    run_dir = imported["v100_training"]
    monkeypatch.setenv("GLMPERF_RUNS", str(run_dir.parent))
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=120)
    at.query_params.update(run=run_dir.name)
    at.switch_page("app_pages/run.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [h.value for h in at.header] == [run_dir.name] and not at.error
    assert len(at.get("plotly_chart")) >= 3
