"""The rollback guard (switches.stability.nan_guard=rollback): a diverging `tiny` run goes back to its
last good state and finishes every step; past max_rollbacks it fails in one line; bad settings fail
before training; the diagnosis counts rollbacks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from optimizers.config import ConfigError
from optimizers.stability import STABILITY, LossWatch, StabilityConfig
from profiler import store
from profiler.analysis import load_run
from profiler.config import load_config
from reference_model.hooks import TrainerHook
from reference_model.rollback import agreed, reason
from reference_model.trainer import Trainer
from reports.figures_advice import stability
from tests.conftest import tiny_run
from tests.test_switch_optim_stability import Collect, PoisonAt, Snapshots, trainer
from tests.test_sync import CountReads, StepMarker

DIVERGES = ("train.lr=1e4", "train.steps=8")
"""A `tiny` run (tests.conftest.TINY's shapes) whose loss explodes at step 1 and whose gradients are NaN
a few steps later."""
EVENT_FIELDS = {"ts", "rank", "attempt", "kind", "step", "to_step", "reason", "loss", "grad_norm", "skipped_batches",
                "lr_scale", "rollbacks"}


def _unstable(run_dir: Path) -> dict:
    (finding,) = [b for b in store.read_run(run_dir)["diagnosis"]["bottlenecks"] if b["kind"] == "unstable"]
    return finding


def test_a_diverging_run_rolls_back_and_finishes_every_step(tmp_path: Path) -> None:
    run_dir = tiny_run(tmp_path, *DIVERGES, "switches.stability.nan_guard=rollback",
                       "switches.stability.rollback_lr_scale=1e-5")  # from lr 1e4 to 0.1: it recovers
    assert store.read_run(run_dir)["status"] == "completed"
    steps = store.read_table(run_dir, "steps").sort_values("step")
    assert steps["step"].tolist() == list(range(8))  # one row per step, none lost to the rollback
    events, _ = store.read_events(run_dir)
    (event,) = [e for e in events if e["kind"] == "rollback"]
    assert set(event) == EVENT_FIELDS
    at = event["step"]
    assert (event["to_step"], event["reason"], event["skipped_batches"]) == (0, "non_finite", at + 1)
    assert (event["lr_scale"], event["rollbacks"]) == (1e-5, 1)
    assert steps["skipped"].tolist() == [s == at for s in range(8)]
    assert steps["lr"].iloc[at + 1] == pytest.approx(steps["lr"].iloc[0] * 1e-5)  # the schedule from step 0, scaled
    assert math.isfinite(steps["loss"].iloc[-1])
    finding = _unstable(run_dir)  # it did diverge: the diagnosis says so, rollbacks in its evidence
    assert finding["evidence"]["rollbacks"]["value"] == 1.0 and "1 rollback(s)" in finding["message"]
    figure = stability(load_run(run_dir))  # the report's loss curve marks it
    assert figure is not None and [t.x for t in figure.data if t.name == "rollback"] == [(at,)]


def test_without_the_guard_the_same_run_reads_unstable(tmp_path: Path) -> None:
    run_dir = tiny_run(tmp_path, *DIVERGES)
    finding = _unstable(run_dir)
    assert finding["severity"] == 1.0 and finding["evidence"]["non_finite"]["value"] >= 1
    assert finding["evidence"]["rollbacks"]["value"] == 0.0
    assert not math.isfinite(store.read_table(run_dir, "steps").sort_values("step")["loss"].iloc[-1])


def test_past_max_rollbacks_the_run_fails_in_one_line(tmp_path: Path) -> None:
    run_dir = tiny_run(tmp_path, "train.lr=1e4", "train.steps=14", "switches.stability.nan_guard=rollback",
                       "switches.stability.rollback_lr_scale=1", "switches.stability.max_rollbacks=1")
    record = store.read_run(run_dir)
    assert record["status"] == "failed"
    assert record["error"].startswith("rank 0 failed: RollbackLimitError: non_finite at step ")
    assert record["error"].endswith("after 1 rollback(s), switches.stability.max_rollbacks=1: the run keeps "
                                    "diverging; lower train.lr or switches.stability.rollback_lr_scale, or raise "
                                    "max_rollbacks")
    (status,) = store.read_rank_statuses(run_dir)
    assert status["traceback"].rstrip().endswith(record["error"].removeprefix("rank 0 failed: "))  # the whole message


class OptimizerState(TrainerHook):
    """The optimizer's state of the first parameter at the start of every step."""

    def __init__(self, trainer_: Trainer) -> None:
        self.optimizer, self.param, self.at = trainer_.optimizer, trainer_.params[0], {}

    def on_step_start(self, step: int) -> None:
        state = self.optimizer.state.get(self.param, {})
        self.at[step] = {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("amp", ["off", "fp16"])
def test_a_rollback_restores_the_last_good_state_and_scales_the_schedule(tmp_path: Path, amp: str) -> None:
    hook = Collect()
    t = trainer(tmp_path, {"amp": amp, "stability": {"nan_guard": "rollback", "rollback_every": 2,
                                                     "rollback_skip_batches": 1}}, steps=6, hooks=[hook])
    snaps, optim = Snapshots(t), OptimizerState(t)
    t.hooks[:0] = [PoisonAt(t, 3), snaps, optim]
    t.fit()
    assert [r.skipped for r in hook.records] == [False, False, False, True, False, False]
    (event,) = [e for e in hook.events if e["kind"] == "rollback"]
    assert {k: event[k] for k in ("step", "to_step", "reason", "skipped_batches", "lr_scale", "rollbacks")} == {
        "step": 3, "to_step": 2, "reason": "non_finite", "skipped_batches": 3, "lr_scale": 0.5, "rollbacks": 1}
    assert all(torch.equal(a, b) for a, b in zip(snaps.at[2], snaps.at[4], strict=True))  # back to step 2's start
    assert optim.at[4].keys() == optim.at[2].keys() and all(torch.equal(optim.at[2][k], optim.at[4][k])
                                                            for k in optim.at[2])
    lrs = [r.lr for r in hook.records]
    assert lrs[4:] == pytest.approx([lrs[2] * 0.5, lrs[3] * 0.5])  # the schedule from step 2, at half
    if amp == "fp16":  # the GradScaler's scale, halved by the NaN step, is step 2's again
        assert hook.records[3].loss_scale < hook.records[4].loss_scale == hook.records[2].loss_scale
    assert all(torch.isfinite(p).all() for p in t.model.parameters())


@pytest.mark.parametrize("policy", ["event", "rollback"])
def test_a_spike_rolls_back_only_under_spike_policy_rollback(tmp_path: Path, policy: str) -> None:
    hook = Collect()
    t = trainer(tmp_path, {"stability": {"nan_guard": "rollback", "spike_policy": policy, "window": 4}},
                steps=5, hooks=[hook])
    t.hooks.insert(0, PoisonAt(t, 3, factor=100.0))  # logits x100: a loss far above 3x the median, finite
    t.fit()
    assert [e["step"] for e in hook.events if e["kind"] == "loss_spike"] == [3]  # read in the step, not later
    rollbacks = [(e["step"], e["to_step"], e["reason"]) for e in hook.events if e["kind"] == "rollback"]
    assert rollbacks == ([(3, 0, "loss_spike")] if policy == "rollback" else [])
    assert [r.skipped for r in hook.records] == [s == 3 and policy == "rollback" for s in range(5)]


def test_the_decision_is_the_loss_watchs_spike_and_any_non_finite_value() -> None:
    watch = LossWatch(StabilityConfig(nan_guard="rollback", spike_policy="rollback", window=4))

    def why(loss: float, norm: float = 1.0, *, check_norm: bool = True, spikes: bool = True) -> str:
        return reason(loss, norm, watch.observe(0, loss, norm), check_norm=check_norm, spikes=spikes)

    assert [why(2.0), why(2.1), why(2.0)] == ["", "", ""]
    assert why(7.0) == "loss_spike" and why(7.0, spikes=False) == ""  # > 3x the median of 2.0, 2.0, 2.1
    assert why(float("nan")) == "non_finite" and why(2.0, float("inf")) == "non_finite"
    assert why(2.0, float("inf"), check_norm=False) == ""  # a GradScaler skips inf gradients itself


def _agree(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=3)
    try:
        Path(out, str(rank)).write_text(agreed(["", "loss_spike", "non_finite"][rank], torch.device("cpu")))
    finally:
        dist.destroy_process_group()


def test_every_rank_takes_the_worst_reason_any_rank_saw(tmp_path: Path) -> None:
    """Else one rank would roll back and skip batches while the others step: their collectives part."""
    mp.start_processes(_agree, args=(f"file://{tmp_path / 'store'}", str(tmp_path)), nprocs=3,
                       start_method="fork")  # torch is already imported: fork skips re-importing it
    assert [(tmp_path / str(r)).read_text() for r in range(3)] == ["non_finite"] * 3


def test_the_guard_reads_the_device_once_a_step_between_copies(tmp_path: Path) -> None:
    mode = CountReads()
    t = trainer(tmp_path, {"stability": {"nan_guard": "rollback", "rollback_every": 2}}, steps=4)
    t.hooks.append(StepMarker(mode))
    with mode:
        t.fit()
    assert (mode.reads[0], mode.reads[2]) == (1, 1)  # steps 1 and 3 also copy the state to the host
    assert mode.reads[1] > 1


@pytest.mark.parametrize(("overrides", "key", "allowed"), [
    (["switches.stability.nan_guard=rollback", "switches.stability.rollback_every=0"],
     "switches.stability.rollback_every", "in [1, "),
    (["switches.stability.rollback_lr_scale=0"], "switches.stability.rollback_lr_scale", "in (0, 1]"),
    (["switches.stability.rollback_lr_scale=1.5"], "switches.stability.rollback_lr_scale", "in (0, 1]"),
    (["switches.stability.max_rollbacks=0"], "switches.stability.max_rollbacks", "in [1, "),
    (["switches.stability.rollback_skip_batches=-1"], "switches.stability.rollback_skip_batches", "in [0, "),
    (["switches.stability.spike_policy=stop"], "switches.stability.spike_policy", "allowed: event, rollback"),
    (["switches.stability.spike_policy=rollback"], "switches.stability.spike_policy",
     "rollback needs nan_guard=rollback"),
])
def test_bad_rollback_settings_fail_in_one_line_before_training(overrides: list[str], key: str,
                                                                allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(preset="tiny", overrides=overrides)
    assert err.value.key == key and allowed in str(err.value) and "\n" not in str(err.value)


def test_the_catalog_proposes_rollback_to_a_run_without_it() -> None:
    (candidate,) = [c for c in STABILITY.candidates if c.set == {"switches.stability.nan_guard": "rollback"}]
    assert candidate.applies(StabilityConfig()) and candidate.applies(StabilityConfig(nan_guard="skip"))
    assert not candidate.applies(StabilityConfig(nan_guard="rollback"))
