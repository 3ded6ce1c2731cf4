"""The diagnosis on real runs: each induced bottleneck comes first with evidence equal to the stored
figures, and healthy runs of each preset are flagged with none of the induced kinds.

The runs are `profile-run` subprocesses with one torch thread (OMP_NUM_THREADS=1), so another
process on the machine does not turn them into oversubscribed runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.diagnosis_scenarios import CONTROLS, INDUCED, SCENARIOS, Scenario, run
from profiler.analysis import analyze, load_run
from profiler.analysis.figures import num
from profiler.metrics import lookup

SCALE = {"%": 100.0, "ms": 1e3}


def _diagnosed(scenario: Scenario, tmp_path: Path) -> dict:
    if scenario.skip:
        pytest.skip(scenario.skip)
    return run(scenario, tmp_path, steps=14, threads=1)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.kind for s in SCENARIOS])
def test_the_induced_bottleneck_comes_first_with_its_stored_evidence(scenario: Scenario, tmp_path: Path) -> None:
    record = _diagnosed(scenario, tmp_path)
    found = record["diagnosis"]["bottlenecks"]
    assert found and found[0]["kind"] == scenario.kind, [(b["kind"], b["severity"]) for b in found]
    others = [b["kind"] for b in found if b["kind"] in INDUCED and b["kind"] not in (scenario.kind,
                                                                                     *scenario.consequences)]
    assert others == [], f"{scenario.kind} run also called {others}"
    figures = analyze(load_run(_run_dir(tmp_path)))
    for name, evidence in found[0]["evidence"].items():
        value = num(evidence["value"])  # a figure not measured is stored null
        assert value == pytest.approx(figures[name].value, rel=1e-9, nan_ok=True), name
        source = evidence["source"]
        if source.startswith("summary.") and " " not in source and evidence["unit"] in SCALE:
            stored = lookup(record["summary"], source.removeprefix("summary."))
            assert value == pytest.approx(SCALE[evidence["unit"]] * num(stored), rel=1e-12, nan_ok=True), name


def _run_dir(runs_dir: Path) -> Path:
    (run_dir,) = [p for p in runs_dir.iterdir() if (p / "run.json").exists()]
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("control", CONTROLS, ids=[c.name for c in CONTROLS])
def test_a_healthy_run_is_flagged_with_none_of_the_induced_kinds(control: Scenario, tmp_path: Path) -> None:
    record = _diagnosed(control, tmp_path)
    found = [b["kind"] for b in record["diagnosis"]["bottlenecks"]]
    assert not set(found) & set(INDUCED), found
    figures = record["diagnosis"]["figures"]
    assert not math.isnan(figures["tiny_op_share"]["value"])  # the rules had what they read
