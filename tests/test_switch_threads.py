"""The threads switch: a run's torch threads are its own (the next run in the process gets the default
again), its changes leave a core to each loader worker or keep one thread per physical core, only a probe
advises them, and a probe runs each side on its own thread count."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from optimizers import REGISTRY, SwitchesConfig, apply_all
from optimizers.config import build_section
from optimizers.threads import physical_cores, process_default, usable_cpus
from profiler.advice.probes import Prober, _Side
from profiler.advice.recommend import explore
from profiler.analysis import load_run
from profiler.config import load_config
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM
from tests.conftest import TINY, tiny_run
from tests.contexts import context

SPARE = pytest.mark.skipif(usable_cpus() < 2, reason="one CPU: no thread count below the default to try")


@pytest.fixture(autouse=True)
def _threads_restored() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _apply(**threads: int) -> list[str]:
    switches = build_section(SwitchesConfig, {"threads": threads}, "switches")
    return apply_all(GLMForCausalLM(model_config("tiny")), switches, context()).notes


@SPARE
def test_a_run_s_threads_are_its_own_and_the_next_run_gets_the_process_default_again() -> None:
    default = process_default()
    assert "threads: 1 torch threads" in _apply(count=1) and torch.get_num_threads() == 1
    assert f"threads: {default} torch threads (the process's default)" in _apply()
    assert torch.get_num_threads() == default


def test_its_changes_leave_a_core_to_each_worker_or_keep_one_thread_per_physical_core() -> None:
    beside, per_core = REGISTRY.get("threads").candidates
    config = {"switches.dataloader.num_workers": 1, "switches.threads.count": 0}
    assert beside.resolve(config.__getitem__) == {"switches.threads.count": max(1, usable_cpus() - 1)}
    # no workers, or no SMT: torch's default stands, which is what the run does already (0)
    assert beside.resolve({**config, "switches.dataloader.num_workers": 0}.__getitem__) == \
        {"switches.threads.count": 0}
    cores = physical_cores()
    assert 1 <= cores <= usable_cpus()
    assert per_core.resolve(config.__getitem__) == {"switches.threads.count": cores if cores < usable_cpus() else 0}
    assert beside.probe_only and per_core.probe_only


@SPARE
def test_a_run_with_loader_workers_gets_a_core_left_to_them_probed_never_modelled(tmp_path: Path) -> None:
    run = load_run(tiny_run(tmp_path, "switches.dataloader.num_workers=1", "profile.trace=false"))
    change = {"switches.threads.count": max(1, usable_cpus() - 1)}
    assert change in [r["set"] for r in explore(run, probing=True)["recommendations"]]
    reasons = [e["reason"] for e in explore(run)["excluded"] if e["set"] == change]
    assert any(r.startswith("not modelled: one core left to each loader worker") for r in reasons), reasons


@SPARE
def test_a_probe_runs_each_side_on_its_own_thread_count(tmp_path: Path) -> None:
    config = load_config(preset="tiny", overrides=[*TINY, "profile.trace=false"]).to_dict()
    with Prober(config, device="cpu", workdir=tmp_path) as prober:
        base = _Side(prober._config({}, "base"), tmp_path / "base", prober.threads)
        cand = _Side(prober._config({"switches.threads.count": 1}, "cand"), tmp_path / "cand", prober.threads)
        try:
            for side, threads in ((cand, 1), (base, prober.threads), (cand, 1)):
                side.step()
                assert torch.get_num_threads() == threads
        finally:
            base.close()
            cand.close()
