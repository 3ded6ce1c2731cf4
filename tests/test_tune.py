"""`glmperf tune` on tiny: a complete record, a tuned config profile-run takes, nothing adopted unproven."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler import store
from profiler.config import load_config
from tests.conftest import TINY, glmperf


@pytest.mark.slow
def test_tune_on_tiny_ends_in_a_proven_config_within_budget_with_a_complete_record(tmp_path):
    runs_dir = tmp_path / "runs"
    # a 30 ms loader delay: a bottleneck with a sure remedy, so tune has at least one round to run
    extra = ["profile.trace_window=[1, 1, 2]", "data.io_delay_ms=30"]
    overrides = [a for o in TINY + extra for a in ("--set", o)]
    proc = glmperf("tune", "--preset", "tiny", *overrides, "--steps", "14", "--repeats", "2", "--max-repeats", "4",
                   "--max-rounds", "2", "--memory-budget-gb", "64", "--probe-budget", "10", "--runs-dir", str(runs_dir),
                   "--no-progress",
                   "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["status"] == "completed" and record["stopped"]
    assert record["spec"]["repeats"] == 2 and record["spec"]["max_repeats"] == 4
    assert 1 <= len([e for e in record["rounds"] if e["kind"] == "change"]) <= 2
    assert record["rounds"][0]["tried"] == {"switches.dataloader.num_workers": 2}
    # ranked by the gain a probe measured on this machine, not by the catalog's model
    assert record["rounds"][0]["expected"]["source"] == "measured", record["rounds"][0]["expected"]
    run_ids = {r["id"] for r in store.list_runs(runs_dir)}
    for entry in record["rounds"]:
        assert entry["diagnosed_run"] in run_ids
        assert entry["tried"] and entry["decision"] in ("adopted", "refused", "kept") and entry["why"]
        assert entry["result"]["verdict"] in ("confirmed", "refuted", "inconclusive", "changes_numerics")
        assert set(entry["result"]["runs"]) <= run_ids
        assert 2 <= entry["repeats"] == len(entry["result"]["runs"]) <= 4
        assert entry["result"]["stopped"] in ("decided", "max_repeats")
        assert (entry["result"]["stopped"] == "decided") == (entry["result"]["verdict"] != "inconclusive")
        assert entry["result"]["risk"] != "changes_model"  # not allowed: never tried
        if entry["decision"] == "adopted":
            assert entry["result"]["verdict"] == "confirmed" and entry["result"]["measured"]["low_pct"] > 0
    adopted = [e["tried"] for e in record["rounds"] if e["decision"] == "adopted"]
    assert record["adopted"] == adopted
    tuned = load_config(config=Path(record["tuned_config"]))
    assert tuned.to_dict() == record["tuned"]["config"]
    start = load_config(preset="tiny", overrides=[*TINY, *extra, "train.steps=14", "profile.memory_budget_gb=64"])
    expected = load_config(base=start.to_dict(), overrides=[f"{k}={v}" for s in adopted for k, v in s.items()])
    assert tuned.to_dict() == expected.to_dict()
    assert record["tuned"]["end"]["peak_memory_gib"] <= 64
    linked = [r for r in store.list_runs(runs_dir) if (r.get("tune") or {}).get("id") == record["id"]]
    assert len(linked) == len(run_ids) == record["tuned"]["runs"]  # every run of the session is linked to it
    assert 0 < record["tuned"]["tuning_s"] <= record["elapsed_s"]


def test_tune_refuses_bad_limits_before_running(tmp_path):
    proc = glmperf("tune", "--preset", "tiny", "--repeats", "0", "--runs-dir", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip() == "glmperf: error: --repeats: got 0; allowed: an integer > 0"
    proc = glmperf("tune", "--preset", "nope", "--runs-dir", str(tmp_path))
    assert proc.returncode == 2 and "--preset" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "tunes").exists()
