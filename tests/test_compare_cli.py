"""`glmperf compare` end to end on real `tiny` runs: exit codes, what it names, and every output format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from profiler.cli import main
from tests.conftest import ROOT, TINY, copy_run
from tests.conftest import cli as profile_run_cli

STEPS = "train.steps=20"


def tiny_run(runs_dir: Path, *overrides: str) -> Path:
    """A tiny run in its own process, as CI makes them (in one process, the RSS high-water mark that
    peak memory is on a CPU would carry over from run to run), on one thread as docs/ci.md advises
    (one busy neighbour on a 2-core machine then leaves it a core)."""
    proc = profile_run_cli("--json", *(f"--set={o}" for o in (*TINY, *overrides)), runs_dir=runs_dir,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return Path(json.loads(out)["path"])


def compare(*args: str) -> subprocess.CompletedProcess:
    """`glmperf compare` in its own process, as CI runs it."""
    return subprocess.run([sys.executable, "-c", "import sys; from profiler.cli import main; sys.exit(main())",
                           "compare", *args], cwd=ROOT, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compare_runs")


@pytest.fixture(scope="module")
def base(runs_dir: Path) -> Path:
    return tiny_run(runs_dir, STEPS, "name=base")


@pytest.fixture(scope="module")
def again(runs_dir: Path) -> Path:
    return tiny_run(runs_dir, STEPS, "name=again")


@pytest.fixture(scope="module")
def slow(runs_dir: Path) -> Path:
    """The same run with 40 ms more input latency a batch (an induced data-loading slowdown)."""
    return tiny_run(runs_dir, STEPS, "data.io_delay_ms=40", "name=slow")


def test_tiny_vs_tiny_passes(base: Path, again: Path) -> None:
    proc = compare(str(base), str(again))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: no gated metric regressed" in proc.stdout and "time/step p50" in proc.stdout
    assert "loss parity: match" in proc.stdout  # same seed and data: the same curve


def test_an_input_slowdown_fails_and_names_data_wait(base: Path, slow: Path) -> None:
    proc = compare(str(base), str(slow))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.splitlines()[1].startswith("FAIL: step_time_p50 regressed (+")
    phases = out[out.index("where the step time changed"):].splitlines()[2:5]  # the three that changed most
    data = next(line.split() for line in phases if line.split()[0] == "data")
    assert float(data[3]) >= 30 and "waiting for the next batch" in " ".join(data)
    assert "config data.io_delay_ms: 0.0 -> 40.0" in out
    assert "loss parity: match" in out  # a later batch is the same batch


def test_json_names_the_phase_and_the_failures(base: Path, slow: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(base), str(slow), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "regressed" and not data["passed"]
    assert {"step_time_p50", "tokens_per_s"} <= set(data["failures"])
    assert next(p for p in data["phases"][:3] if p["name"] == "data")["change_ms"] >= 30
    p50 = next(m for m in data["metrics"] if m["name"] == "step_time_p50")["estimate"]
    assert p50["verdict"] == "regressed" and p50["ci"][0] > 0 and 0 <= p50["p_value"] <= 1
    assert data["ops"] and data["ops_time"] == "self CPU time"


def test_junit_parses_with_a_failure_per_regressed_gate(base: Path, slow: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "reports" / "compare.xml"
    assert main(["compare", str(base), str(slow), "--format", "junit", "--output", str(out)]) == 1
    assert capsys.readouterr().out.startswith("glmperf compare: baseline 1 run")  # the text still on stdout
    suite = ET.parse(out).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"step_time_p50 +5%", "tokens_per_s -5%", "peak_memory +10%"}
    assert cases["step_time_p50 +5%"].find("failure") is not None
    assert int(suite.get("failures")) >= 2 and int(suite.get("tests")) == 3
    assert "where the step time changed" in suite.find("system-out").text


def test_markdown_is_a_table_for_a_pull_request(base: Path, again: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(base), str(again), "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("### glmperf compare: PASS")
    table = [line for line in md.splitlines() if line.startswith("| time/step p50 |")]
    assert len(table) == 1 and len(table[0].split(" | ")) == 8


def test_a_gate_file_sets_the_thresholds(base: Path, slow: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    gate = tmp_path / "gate.yaml"
    gate.write_text("metrics:\n  peak_memory: +50%\nreport: {}\nconfidence: 0.95\n")
    assert main(["compare", str(base), str(slow), "--gate", str(gate)]) == 0  # step time is not gated here
    out = capsys.readouterr().out
    assert "95% interval" in out and "memory/peak" in out and "time/step p50" not in out


def test_runs_by_name_and_a_directory_of_runs(runs_dir: Path, base: Path, again: Path, slow: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    for run in (base, again):
        copy_run(run, tmp_path)
    assert main(["compare", "slow", "--vs", str(tmp_path), "--runs-dir", str(runs_dir), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)  # faster: never a failure
    assert data["base"] == [slow.name] and sorted(data["cand"]) == sorted([base.name, again.name])


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glmperf: error: ") and "Traceback" not in proc.stderr
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(base: Path, tmp_path: Path) -> None:
    corrupt = copy_run(base, tmp_path)
    (corrupt / "steps.parquet").write_bytes(b"PAR1 not really")
    assert f"run {corrupt.name} is corrupt: steps.parquet" in _one_error_line(compare(str(base), str(corrupt)))
    assert "no run 'nope'" in _one_error_line(compare(str(base), "nope", "--runs-dir", str(tmp_path)))
    line = _one_error_line(compare(str(base), str(base), "--metric", "step_tim_p50:+5%"))
    assert "unknown metric 'step_tim_p50'; known: step_time_p50" in line
    gate = tmp_path / "gate.yaml"
    gate.write_text("metrics: [step_time_p50\n")
    assert f"--gate: {gate} is not valid YAML" in _one_error_line(compare(str(base), str(base), "--gate", str(gate)))
    assert "takes BASE CAND" in _one_error_line(compare(str(base)))


def test_an_unfinished_run_is_refused(base: Path, failed_run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(base), str(failed_run)]) == 2
    assert "is failed, not completed" in capsys.readouterr().err


@pytest.mark.slow
def test_a_gated_loss_drift_fails_as_a_numerics_change(runs_dir: Path, base: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    other_lr = tiny_run(runs_dir, STEPS, "train.lr=0.01", "name=other-lr")
    assert main(["compare", str(base), str(other_lr), "--metric", "loss_parity:0.1%", "--metric", "step_time_p50:+500%",
                "--metric", "tokens_per_s:-80%", "--metric", "peak_memory:+50%"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: loss_parity: the loss curves drift" in out and "loss parity: drift" in out


@pytest.mark.slow
def test_repeats_make_runs_the_unit(runs_dir: Path, base: Path, again: Path, slow: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    """Three interleaved runs a side: the runs, not the steps, are what the test and the spread count."""
    third = tiny_run(runs_dir, STEPS, "name=third")
    slower = [slow, *(tiny_run(runs_dir, STEPS, "data.io_delay_ms=40", f"name=slow{i}") for i in (2, 3))]
    assert main(["compare", str(base), str(again), str(third), "--vs", *map(str, slower), "--format", "json"]) == 1
    p50 = next(m for m in json.loads(capsys.readouterr().out)["metrics"] if m["name"] == "step_time_p50")
    assert p50["estimate"]["unit"] == "runs" and p50["estimate"]["runs"] == [3, 3]
    assert p50["estimate"]["verdict"] == "regressed"
