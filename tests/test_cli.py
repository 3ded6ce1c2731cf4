"""The command line as a new user meets it: what it prints, and one clear line for every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiler import store
from tests.conftest import ROOT, TINY, cli, copy_run, glmperf


def _one_error_line(proc, prog: str = "glmperf") -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


def test_show_prints_the_table_and_every_bracketed_note_verbatim(failed_run: Path) -> None:
    proc = glmperf("show", str(failed_run))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "rank 0 failed: RuntimeError: induced failure at step 5 [/bold] [process RSS (CPU)]" in out
    assert "[process RSS high-water mark (CPU)]" in out and "GFLOP/s fp32 x 1, calibrated" in out
    assert "status" in out and "failed" in out and "time/step p50 (ms)" in out


def test_show_takes_what_runs_prints(completed_run: Path) -> None:
    listed = glmperf("runs", "--runs-dir", str(completed_run.parent))
    assert listed.returncode == 0 and completed_run.name in listed.stdout and "completed" in listed.stdout
    for ref in (completed_run.name, "completed"):
        proc = glmperf("show", ref, "--runs-dir", str(completed_run.parent))
        assert proc.returncode == 0 and f"run {completed_run.name}" in proc.stdout
    as_json = json.loads(glmperf("show", completed_run.name, "--json", env={
        **os.environ, "GLMPERF_RUNS": str(completed_run.parent)}).stdout)
    assert as_json["summary"] == store.read_run(completed_run)["summary"]


def test_show_of_a_killed_run_summarizes_its_flushed_steps_and_says_so(killed_run: Path) -> None:
    proc = glmperf("show", str(killed_run))
    assert proc.returncode == 0, proc.stderr
    counted = len(store.read_table(killed_run, "steps")) - 1
    assert f"{counted} of {counted + 1}" in proc.stdout and "incomplete" in proc.stdout
    assert "the run was killed" in proc.stdout


def test_finalize_recovers_a_killed_run(killed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(killed_run, tmp_path)
    proc = glmperf("finalize", str(run_dir))
    record = store.read_run(run_dir)
    assert proc.returncode == 1 and record["status"] == "failed"  # rank 0 never reported how it ended
    assert record["summary"]["steps_counted"] == len(store.read_table(run_dir, "steps")) - 1


def test_a_corrupt_run_is_listed_with_what_is_wrong_and_show_refuses_it(completed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    (run_dir / "steps.parquet").write_bytes(b"PAR1 not really")
    listed = glmperf("runs", "--runs-dir", str(tmp_path))
    assert listed.returncode == 0 and "corrupt" in listed.stdout and "steps.parquet is not readable" in listed.stdout
    line = _one_error_line(glmperf("show", str(run_dir)))
    assert f"run {run_dir.name} is corrupt: steps.parquet is not readable parquet" in line


@pytest.mark.parametrize("command", ["show", "finalize"])
def test_a_truncated_run_json_is_one_line(completed_run: Path, tmp_path: Path, command: str) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    (run_dir / "run.json").write_text('{"id": "x", "status": "compl')
    assert "run.json is not valid JSON (truncated or damaged" in _one_error_line(glmperf(command, str(run_dir)))


def test_a_run_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    line = _one_error_line(glmperf("show", "no-such-run", "--runs-dir", str(tmp_path)))
    assert "no run 'no-such-run'" in line and "glmperf runs" in line


def test_runs_says_when_there_is_no_runs_directory_or_no_run(tmp_path: Path) -> None:
    assert "no runs directory at" in _one_error_line(glmperf("runs", "--runs-dir", str(tmp_path / "none")))
    empty = glmperf("runs", "--runs-dir", str(tmp_path))
    assert empty.returncode == 0 and empty.stdout.strip() == f"no runs in {tmp_path}"


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_profile_run_refuses_a_runs_dir_it_cannot_use_before_any_work(tmp_path: Path, kind: str) -> None:
    if kind == "file":
        runs_dir = tmp_path / "runs"
        runs_dir.write_text("not a directory")
        expected = "is a file, not a directory"
    else:
        runs_dir = Path("/proc/1/glmperf-runs")  # nobody, root included, may create a directory there
        expected = "is not writable"
    proc = cli("--steps", "2", runs_dir=runs_dir)
    out, err = proc.communicate(timeout=120)
    line = _one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), prog="profile-run")
    assert str(runs_dir) in line and expected in line


def test_the_demo_output_speaks_of_the_product_only(tmp_path: Path) -> None:
    proc = cli("--steps", "3", *[f"--set={o}" for o in TINY], "--no-trace", runs_dir=tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "run " in out and "time/step p50" in out
    for word in ("issue", "not rendered", "coming"):
        assert word not in out.lower()


def test_diagnose_and_recommend_read_a_stored_run(completed_run: Path) -> None:
    stored = store.read_run(completed_run)["diagnosis"]
    proc = glmperf("diagnose", str(completed_run), "--json")
    assert proc.returncode == 0, proc.stderr
    fresh = json.loads(proc.stdout)
    assert fresh["bottlenecks"] == stored["bottlenecks"] and fresh["verdict"] == stored["verdict"]
    text = glmperf("diagnose", str(completed_run)).stdout
    assert text.startswith(f"diagnosis of run {completed_run.name}: {stored['verdict']}")
    recs = json.loads(glmperf("recommend", str(completed_run), "--json", "--top", "1", "--probe-budget", "0"
                              ).stdout)["recommendations"]
    assert len(recs) <= 1
    for rec in recs:
        assert rec["command"].startswith(f"profile-run --from-run {completed_run}")


@pytest.mark.parametrize("args", [("recommend", "--top", "0"), ("diagnose", "nope")])
def test_diagnose_and_recommend_refuse_bad_input_in_one_line(completed_run: Path, args: tuple[str, ...]) -> None:
    ref = [] if args[-1] == "nope" else [str(completed_run)]
    _one_error_line(glmperf(*args, *ref, "--runs-dir", str(completed_run.parent)))


def test_from_run_reruns_a_stored_runs_config_with_a_change(completed_run: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "profiler.cli", "--from-run", str(completed_run), "--set",
                           "train.steps=3", "--no-trace", "--no-progress", "--runs-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    (run,) = store.list_runs(tmp_path)
    old, new = store.read_run(completed_run)["config"], run["config"]
    assert new["train"]["steps"] == 3 and new["profile"]["trace"] is False
    assert {k: v for k, v in new.items() if k not in ("train", "profile")} == \
        {k: v for k, v in old.items() if k not in ("train", "profile")}
