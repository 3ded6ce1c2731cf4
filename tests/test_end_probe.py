"""profile-run's end-probe: a completed one-process run's advice probed in the run's own process, into
the cache `glmperf recommend` reads, within `--probe-budget`; a failure or Ctrl-C never costs the run.

Real `tiny` runs with a fresh probe cache each. What a tiny run is advised depends on the machine (no
bottleneck: the changes that make compute faster are explored, bf16 among them only where the CPU runs it
natively; a step the optimizer dominates: its own changes): the end-probe measures what recommend would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from profiler import store
from profiler.analysis.environment import NATIVE_BF16_FLAGS
from profiler.capture.end_probe import probe_at_end
from profiler.instruments.machine import cpu_flags
from tests.conftest import ROOT, TINY, cli, copy_run, glmperf

NATIVE = bool(NATIVE_BF16_FLAGS & set(cpu_flags()))
BF16 = {"switches.amp.dtype": "bf16"}
RUN = [*[f"--set={o}" for o in TINY], "--steps", "8", "--no-trace", "--name", "plain"]


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "GLMPERF_CACHE": str(cache)}


def _profile_run(runs: Path, cache: Path, *args: str) -> tuple[str, dict]:
    """profile-run on `tiny` with `args`; its stdout and run.json."""
    proc = cli(*RUN, *args, runs_dir=runs, env=_env(cache))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    (run,) = store.list_runs(runs)
    return out, store.read_run(Path(run["path"]))


def test_a_run_probes_its_advice_at_its_end_and_recommend_reads_it_from_the_cache(tmp_path: Path) -> None:
    out, record = _profile_run(tmp_path / "runs", tmp_path / "cache", "--probe-budget", "30")
    end = record["end_probes"]
    measured = [c["set"] for c in end["changes"] if c["state"] == "measured"]
    assert end["budget_s"] == 30 and end["measured"] == len(measured) >= 1 and end["seconds"] > 0
    assert NATIVE or BF16 not in [c["set"] for c in end["changes"]]  # emulated bf16 is never advised nor probed
    assert all(c["state"] == "left" for c in end["changes"] if "switches.compile.mode" in c["set"])
    line = out.splitlines()[-1]
    assert line.startswith(f"probed {len(measured)} change") and f"`glmperf recommend {record['id']}` uses" in line
    # the run's stored advice, which its summary above, the report and the dashboard read, is the measured one:
    # each measured change is advised with its measured range, or excluded for what it measured
    advice = record["diagnosis"]
    advised = {json.dumps(r["set"]): r["expected"]["source"] for r in advice["recommendations"]}
    dropped = {json.dumps(e["set"]): e["reason"] for e in advice["excluded"]}
    for change in map(json.dumps, measured):
        assert advised.get(change) == "measured" or dropped[change].startswith("measured on this machine"), change
    assert ("(measured)" in out.split(line)[0]) == ("measured" in advised.values())
    # recommend asks for the same changes and finds every one the run's end measured in the cache; a budget
    # too small to start a probe: what it has is the cache's
    rec = glmperf("recommend", "plain", "--runs-dir", str(tmp_path / "runs"), "--json", "--probe-budget", "1",
                  env=_env(tmp_path / "cache"))
    assert rec.returncode == 0, rec.stderr
    probes = json.loads(rec.stdout)["probes"]
    assert probes["measured"] == 0 and probes["cached"] == len(measured)
    assert [c["set"] for c in probes["changes"] if c["state"] == "cached"] == measured
    assert probes["at_run_end"] == end


def test_a_budget_of_0_probes_nothing(tmp_path: Path) -> None:
    out, record = _profile_run(tmp_path / "runs", tmp_path / "cache", "--probe-budget", "0")
    assert "end_probes" not in record and "end_probes_error" not in record
    assert record["config"]["profile"]["probe_budget_s"] == 0
    assert "probed" not in out and not (tmp_path / "cache" / "probes").exists()


def test_ctrl_c_while_probing_leaves_the_run_completed_as_it_was(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "profiler.cli", "--preset", "tiny", *RUN, "--runs-dir", str(runs)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path / "cache"))
    assert proc.stderr is not None
    for line in proc.stderr:  # the progress line that says a probe starts
        if line.strip().startswith("probing "):
            break
    else:
        raise AssertionError(f"no probe started: {proc.communicate(timeout=60)}")
    (run,) = store.list_runs(runs)
    before = store.read_run(Path(run["path"]))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert f"probing stopped: run {run['id']} is completed as it was" in out
    assert store.read_run(Path(run["path"])) == before and before["status"] == "completed"


def test_a_probe_that_fails_costs_the_run_nothing_and_says_why(completed_run: Path, tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path / "cache"))
    run_dir = copy_run(completed_run, tmp_path / "runs")
    empty = tmp_path / "empty.txt"
    empty.write_text("")  # a corpus its config accepts and its trainer refuses: the probe fails building it
    config = store.read_run(run_dir)["config"]
    store.update_run(run_dir, config={**config, "data": {**config["data"], "corpus": str(empty)}})
    probed = probe_at_end(run_dir, budget_s=10)
    assert probed is not None and not probed.interrupted
    record = store.read_run(run_dir)
    (failed,) = [c for c in record["end_probes"]["changes"] if c["state"] == "failed"]
    assert failed["why"].startswith("the probe failed: ConfigError") and record["status"] == "completed"
    assert probed.line.startswith("probed 0 changes") and "the probe failed: ConfigError" in probed.line
    # a run whose advice cannot be read at all: the error is the end-probe's, the run stays as it was
    store.update_run(run_dir, config={k: v for k, v in config.items() if k != "train"})
    probed = probe_at_end(run_dir, budget_s=10)
    record = store.read_run(run_dir)
    assert probed is not None and probed.line.startswith("probing failed (")
    assert record["status"] == "completed" and record["end_probes_error"] in probed.line
