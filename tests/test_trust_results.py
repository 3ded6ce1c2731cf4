"""What glmperf reports must be what happened: a sweep cell trains what its label says, every --json is
JSON any parser reads, compare says when it cannot compare, numbers are checked before any run, and
a run disturbed in bursts is not called a regression (while a slowdown of every step still is)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.analysis import load_run
from profiler.cli import main
from profiler.experiments import records
from profiler.experiments.verify import COMBINED, trials_for
from reference_model.hooks import TrainerHook
from tests.conftest import ROOT, copy_run, glmperf, tiny_run

STORED = ROOT / "tests" / "data" / "runs" / "h200-small-bf16"
"""A real stored run (an H200 `small` run) one of whose figures is NaN."""


def strict(text: str) -> object:
    """JSON as a strict parser reads it: NaN, Infinity and -Infinity are not JSON."""
    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glmperf: error: ") and "Traceback" not in proc.stderr, lines
    return lines[0]


def nothing_ran(runs_dir: Path) -> bool:
    return not runs_dir.exists() or not any(runs_dir.iterdir())


# --- a sweep's cells train what their labels say ------------------------------------------------------------------

@pytest.mark.parametrize("grid, field", [
    (["switches.amp=off,bf16", "switches.amp.dtype=off,bf16"], "switches.amp.dtype"),  # a shorthand and its field
    (["switches.amp.dtype=off,bf16", "switches.amp={dtype: off},{dtype: fp16}"], "switches.amp.dtype"),
    (["model.preset=tiny,small", "model.hidden_size=64,128"], "model.hidden_size"),  # a preset sets every field
])
def test_a_grid_setting_one_field_twice_is_refused_before_any_cell(grid: list[str], field: str, tmp_path: Path) -> None:
    args = [a for g in grid for a in ("--grid", g)]
    line = one_error_line(glmperf("sweep", "--preset", "tiny", *args, "--runs-dir", str(tmp_path / "runs")))
    assert f"both set {field}" in line and "allowed: one --grid per field" in line
    assert nothing_ran(tmp_path / "runs")


def test_grid_values_that_mean_the_same_are_refused_as_duplicate_cells(tmp_path: Path) -> None:
    line = one_error_line(glmperf("sweep", "--preset", "tiny", "--grid", "profile.trace=off,false", "--runs-dir",
                                  str(tmp_path)))
    assert "cells profile.trace=off and profile.trace=false resolve to the same config" in line
    assert nothing_ran(tmp_path)


def test_a_shorthand_and_its_full_name_are_one_change_to_tune_and_verify(completed_run: Path) -> None:
    run = load_run(completed_run)
    recs = [{"switch": "amp", "set": s, "judged_by": "tokens_per_s", "risk": "none", "for": "test",
             "expected": {"basis": "test"}} for s in ({"switches.amp": "bf16"}, {"switches.amp.dtype": "fp16"})]
    trials = trials_for(run, recs, repeats=1, steps=16)  # two settings of one field: never "all together"
    assert COMBINED not in [t.label for t in trials.trials]
    assert trials.refused[0] == {"label": COMBINED, "reason": "two recommendations set one key differently"}
    assert records.canonical({"switches.amp": "bf16"}) == records.canonical({"switches.amp.dtype": "bf16"})


# --- every --json and every record is strict JSON -------------------------------------------------------------

@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the stored run: a command may refresh a stale diagnosis in its run.json, never in tests/data."""
    return copy_run(STORED, tmp_path_factory.mktemp("stored"))


def _args(template: list[str], run: Path) -> list[str]:
    return [{"RUN": str(run), "RUNS": str(run.parent)}.get(a, a) for a in template]


@pytest.mark.parametrize("args", [["show", "RUN", "--json"], ["runs", "--runs-dir", "RUNS", "--json"],
                                  ["diagnose", "RUN", "--json"], ["recommend", "RUN", "--json"]])
def test_json_output_is_strict_json_with_null_for_nan(args: list[str], stored: Path) -> None:
    assert "NaN" in (STORED / "run.json").read_text()  # the stored run holds one (written before records were strict)
    proc = glmperf(*_args(args, stored))
    assert proc.returncode == 0, proc.stderr
    strict(proc.stdout)


def test_import_json_is_strict_json(completed_run: Path, tmp_path: Path) -> None:
    proc = glmperf("import", str(completed_run / "traces"), "--runs-dir", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    imported = strict(proc.stdout)
    assert isinstance(imported, dict) and imported["summary"]["tokens_per_s"] is None  # a trace has no tokens


def test_an_experiments_record_is_written_as_strict_json(tmp_path: Path) -> None:
    record_dir = records.create(tmp_path, "sweep", "nan", {"cells": [{"tokens_per_s": math.nan, "low": -math.inf}]})
    assert strict((record_dir / "sweep.json").read_text())["cells"] == [{"tokens_per_s": None, "low": None}]


# --- compare says when it cannot compare ------------------------------------------------------------------------

def test_comparing_a_run_with_itself_is_refused(completed_run: Path, tmp_path: Path) -> None:
    copy = copy_run(completed_run, tmp_path)  # the same run elsewhere is the same run
    for cand in (completed_run, copy):
        line = one_error_line(glmperf("compare", str(completed_run), str(cand)))
        assert f"comparing a run with itself: run {completed_run.name} is on both sides" in line


@pytest.fixture(scope="module")
def bigger_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("bigger"), "train.steps=8", "data.io_delay_ms=20", "name=bigger",
                    "model.hidden_size=128", "model.num_hidden_layers=4")


def test_runs_of_different_models_are_not_comparable_unless_allowed(completed_run: Path, bigger_model: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", str(completed_run), str(bigger_model)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not comparable: the runs train different models or shapes" in err[0], err
    assert "model.hidden_size 64 vs 128, model.num_hidden_layers 2 vs 4" in err[0]
    assert "--allow-different-models" in err[0]
    main(["compare", str(completed_run), str(bigger_model), "--allow-different-models"])
    said = capsys.readouterr().out.splitlines()[2]  # up front: after the title and the verdict
    assert said.startswith("the runs train different models or shapes: model.hidden_size 64 vs 128")


def test_an_option_without_a_gate_file_is_named_as_the_command_lines(completed_run: Path,
                                                                      bigger_model: Path) -> None:
    line = one_error_line(glmperf("compare", str(completed_run), str(bigger_model), "--confidence", "0.3"))
    assert line == "glmperf: error: the command line: confidence must be in [0.5, 1), got 0.3"


# --- numbers are checked before any run ---------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["tune", "--preset", "tiny", "--steps", "3"], "--steps: got 3; allowed: at least 15"),
    (["tune", "--preset", "tiny", "--memory-budget-gb", "nan"], "--memory-budget-gb: got nan; allowed: a finite"),
    (["tune", "--preset", "tiny", "--time-budget-min", "inf"], "--time-budget-min: got inf; allowed: a finite"),
    (["tune", "--preset", "tiny", "--set", "train.steps=4"], "train.steps: got 4; allowed: at least 15"),
    (["sweep", "--preset", "tiny", "--grid", "switches.amp=off,bf16", "--repeats", "nan"], "--repeats: got nan"),
    (["compare", "a", "b", "--run-noise", "nan"], "--run-noise: got nan; allowed: a finite number >= 0"),
    (["compare", "a", "b", "--confidence", "inf"], "--confidence: got inf; allowed: a finite number"),
    (["recommend", "a", "--verify", "--steps", "-1"], "--steps: got -1; allowed: an integer > 0"),
])
def test_bad_numbers_are_refused_in_one_line_before_any_run(args: list[str], says: str, tmp_path: Path) -> None:
    line = one_error_line(glmperf(*args, "--runs-dir", str(tmp_path / "runs")))
    assert says in line
    assert nothing_ran(tmp_path / "runs")


# --- a reader that goes away ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["show", "RUN"], ["show", "RUN", "--json"], ["runs", "--runs-dir", "RUNS"]])
def test_a_closed_pipe_ends_the_command_quietly(args: list[str], stored: Path) -> None:
    """`glmperf show X | head`: the reader is gone before glmperf writes."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from profiler.cli import main; sys.exit(main())",
                             *_args(args, stored)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err.decode() == ""


# --- a run disturbed in bursts is not a regression; a slowdown of every step is -------------------------------

class StallOn(TrainerHook):
    """Stalls the input `ms` in the steps `which` picks, as a shared disk or another process would: time
    the step waits, not CPU another process takes (compare's contention check leaves such waits out)."""

    def __init__(self, ms: float, which: str) -> None:
        self.s, self.which = ms / 1e3, which

    def on_phase_start(self, step: int, phase: str) -> None:
        if phase == "data" and (self.which == "every" or step % 5 < 3):  # bursts: 6 in each half of steps 1-20
            time.sleep(self.s)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread while the test's runs train, as docs/ci.md advises for comparable runs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_run_slowed_in_bursts_is_inconclusive_and_a_steady_slowdown_still_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture, one_thread: None) -> None:
    made = {name: tiny_run(tmp_path / name, "train.steps=21", "profile.trace=false", f"name={name}", hooks=hooks)
            for name, hooks in (("base", ()), ("bursts", (StallOn(300, "bursts"),)),
                                ("slow", (StallOn(300, "every"),)))}
    gate = tmp_path / "gate.yaml"
    gate.write_text("metrics: {step_time_p50: +5%, tokens_per_s: -5%}\n")  # speed only: runs of one process
    assert main(["compare", str(made["base"]), str(made["bursts"]), "--gate", str(gate), "--format", "json"]) == 0
    p50 = json.loads(capsys.readouterr().out)["metrics"][0]["estimate"]
    assert p50["verdict"] == "inconclusive" and p50["change"] > 0.5, p50  # the median moved by the sleeps
    assert p50["reason"].startswith("looks regressed") and "is unstable" in p50["reason"]
    assert "fastest steps do not show the change" in p50["reason"]
    assert main(["compare", str(made["base"]), str(made["slow"]), "--gate", str(gate)]) == 1
    assert capsys.readouterr().out.splitlines()[1].startswith("FAIL: step_time_p50 regressed")
