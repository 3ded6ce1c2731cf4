"""A memory-bound run on several ranks is advised to shard, and told by `glmperf plan` how much a rank then
holds; the sharded run holds what it was told."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.diagnosis_scenarios import Scenario, run
from profiler.advice.plan import plan
from profiler.config import build_run_config, load_config
from profiler.settings import override_texts

BUDGET = "profile.memory_budget_gb=0.25"
"""Below any process's peak: the run is memory bound on every machine."""
pytestmark = pytest.mark.slow


def _record(tmp_path: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    run(Scenario(name, "", "tiny", (BUDGET, *overrides), nproc=2), tmp_path / name, steps=6)
    (path,) = [p for p in (tmp_path / name).iterdir() if (p / "run.json").exists()]
    return json.loads((path / "run.json").read_text())


def _mib(text: str) -> float:
    return float(text.replace(",", ""))


def test_a_memory_bound_ddp_run_is_told_what_fsdp_holds_and_fsdp_holds_it(tmp_path: Path) -> None:
    ddp = _record(tmp_path, "ddp", [])
    diagnosis = ddp["diagnosis"]
    assert "memory_bound" in [b["kind"] for b in diagnosis["bottlenecks"]]
    (shard,) = [r for r in diagnosis["recommendations"] if r["set"] == {"switches.parallel.fsdp": 2}]
    (note,) = [n for n in shard["notes"] if n.startswith("`glmperf plan`")]
    change = override_texts(shard["set"])
    before = plan(build_run_config(ddp["config"]), 2).per_rank_bytes
    after = plan(load_config(base=ddp["config"], overrides=change, nproc=2, check_here=False), 2).per_rank_bytes
    totals = re.match(r"`glmperf plan`: ([\d,.]+) -> ([\d,.]+) MiB a rank", note)
    assert totals is not None, note
    assert _mib(totals[1]) == pytest.approx(before["total"] / 2**20, abs=0.05)
    assert _mib(totals[2]) == pytest.approx(after["total"] / 2**20, abs=0.05)
    assert f"params {before['params'] / 2**20:,.1f} -> {after['params'] / 2**20:,.1f}" in note
    sharded = _record(tmp_path, "fsdp", change)
    for rank, (was, held) in enumerate(zip(ddp["ranks"], sharded["ranks"], strict=True)):
        for part in ("params", "grads", "optimizer"):
            assert held["held_bytes"][part] == pytest.approx(after[part], rel=0.05), (rank, part)
            assert held["held_bytes"][part] == pytest.approx(was["held_bytes"][part] / 2, rel=0.05), (rank, part)
