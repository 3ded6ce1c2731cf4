"""Every diagnosis rule at its threshold (just below: silent; just above: fires), and the
recommender's expected-gain arithmetic, on figures built by hand."""

from __future__ import annotations

import math

import pytest

from optimizers import Candidate, Effect
from optimizers.vocabulary import Bottleneck
from profiler.advice import diagnose as d
from profiler.advice.recommend import expected
from profiler.analysis.figures import Figure, Figures

HEALTHY = {
    "share.data": 1.0, "share.h2d": 0.0, "share.forward": 30.0, "share.backward": 60.0, "share.optimizer": 8.0,
    "share.comm": 0.0, "share.checkpoint": 0.0, "share.other": 1.0, "data_wait": 1.0, "data_wait_ms": 0.2,
    "mfu": 40.0, "steps_counted": 20.0, "memory_use": 10.0, "peak_memory": 1.0, "memory_capacity": 10.0,
    "op_calls_per_step": 2000.0, "tiny_op_share": 10.0, "matmul_share": 60.0, "attention_share": 10.0,
    "attention_flop_share": 10.0, "attention_fused_share": 100.0,
    "native_bf16": 1.0, "bf16_speedup": 2.0, "run_dtype_speedup": 2.0, "cores": 8.0, "thread_demand": 4.0,
    "other_cpu_busy": 0.0, "non_finite": 0.0, "skipped_steps": 0.0, "loss_spikes": 0.0, "loss_change": -20.0,
    "grad_norm_outliers": 0.0, "recompiles": 0.0,
}
"""A run with every figure inside its rule's threshold (bf16 already on)."""


def figures(**changes: float) -> Figures:
    values = {**HEALTHY, **{k.replace("__", "."): v for k, v in changes.items()}}
    return {name: Figure(value, "", "test") for name, value in values.items() if not math.isnan(value)}


def kinds(f: Figures) -> list[str]:
    return [b["kind"] for b in d.diagnose(f)["bottlenecks"]]


def test_a_healthy_run_has_no_bottleneck_and_says_where_the_time_goes() -> None:
    result = d.diagnose(figures())
    assert result["bottlenecks"] == []
    assert result["verdict"] == "no bottleneck found: the biggest phase is backward (60% of the step)"


EPS = 1e-6
CASES = [
    ("input_bound", {"data_wait": d.INPUT_SHARE}, {"data_wait": d.INPUT_SHARE + EPS}),
    ("memory_bound", {"memory_use": d.MEMORY_USE}, {"memory_use": d.MEMORY_USE + EPS}),
    ("host_bound", {"tiny_op_share": d.TINY_OPS - EPS}, {"tiny_op_share": d.TINY_OPS}),
    ("comm_bound", {"comm_exposed": d.COMM_SHARE}, {"comm_exposed": d.COMM_SHARE + EPS}),
    ("optimizer_bound", {"share__optimizer": d.OPTIMIZER_SHARE}, {"share__optimizer": d.OPTIMIZER_SHARE + EPS}),
    ("attention_bound", {"attention_share": d.ATTENTION_SHARE / 0.9 - EPS, "attention_flop_share": d.ATTENTION_FLOPS},
     {"attention_share": d.ATTENTION_SHARE / 0.9 + EPS, "attention_flop_share": d.ATTENTION_FLOPS}),  # fwd+bwd: 90%
    ("low_precision_unused", {"run_dtype_speedup": 1.0, "bf16_speedup": d.LOW_PRECISION_SPEEDUP - EPS},
     {"run_dtype_speedup": 1.0, "bf16_speedup": d.LOW_PRECISION_SPEEDUP}),
    ("precision_emulated", {"run_dtype_speedup": d.EMULATED_SPEEDUP}, {"run_dtype_speedup": d.EMULATED_SPEEDUP - EPS}),
    ("checkpoint_bound", {"share__checkpoint": d.CHECKPOINT_SHARE}, {"share__checkpoint": d.CHECKPOINT_SHARE + EPS}),
    ("straggler", {"straggler": d.STRAGGLER_RATIO, "slowest_rank": 1.0},
     {"straggler": d.STRAGGLER_RATIO + EPS, "slowest_rank": 1.0}),
    ("cpu_oversubscribed", {"thread_demand": 8.0 + d.OVERSUBSCRIPTION},
     {"thread_demand": 8.0 + d.OVERSUBSCRIPTION + EPS}),
    ("throttled", {"throttled": d.THROTTLED_SHARE, "sm_clock_drop": 0.0},
     {"throttled": d.THROTTLED_SHARE + EPS, "sm_clock_drop": 0.0}),
    ("recompiling", {"recompiles": 0.0}, {"recompiles": 1.0}),
    ("unstable", {"skipped_steps": 0.0}, {"skipped_steps": 1.0}),
    ("compute_bound", {"mfu": d.LOW_MFU}, {"mfu": d.LOW_MFU - EPS}),
]


@pytest.mark.parametrize(("kind", "below", "above"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_is_silent_below_its_threshold_and_fires_above(kind: str, below: dict, above: dict) -> None:
    assert kind not in kinds(figures(**below))
    result = d.diagnose(figures(**above))
    (finding,) = [b for b in result["bottlenecks"] if b["kind"] == kind]
    assert 0 < finding["severity"] <= 1 and finding["rule"] == kind and finding["threshold"]
    assert finding["evidence"] and all(set(e) == {"value", "unit", "source"} for e in finding["evidence"].values())


@pytest.mark.parametrize(("flops", "fused", "fires"), [
    (d.ATTENTION_FLOPS - EPS, d.FUSED, False),  # short sequence, fused kernels: nothing long to shorten
    (d.ATTENTION_FLOPS, d.FUSED, True),  # long sequence
    (d.ATTENTION_FLOPS - EPS, d.FUSED - EPS, True),  # unfused: SDPA would shorten it
    (math.nan, d.FUSED, True),  # a model whose attention FLOPs are not known: the time share alone
])
def test_attention_is_a_bottleneck_when_the_sequence_is_long_or_its_kernels_unfused(
        flops: float, fused: float, fires: bool) -> None:
    f = figures(attention_share=50.0, attention_flop_share=flops, attention_fused_share=fused)
    assert ("attention_bound" in kinds(f)) is fires


def test_the_evidence_is_the_figures_the_rule_read() -> None:
    (finding,) = d.diagnose(figures(data_wait=42.0, data_wait_ms=12.5))["bottlenecks"]
    assert finding["kind"] == "input_bound" and finding["severity"] == pytest.approx(0.42)
    assert finding["evidence"] == {"data_wait": {"value": 42.0, "unit": "", "source": "test"},
                                   "data_wait_ms": {"value": 12.5, "unit": "", "source": "test"}}


def test_findings_are_ranked_by_the_share_they_explain() -> None:
    assert kinds(figures(data_wait=20.0, share__optimizer=40.0)) == ["optimizer_bound", "input_bound"]
    assert kinds(figures(non_finite=1.0, data_wait=90.0))[0] == "unstable"  # a broken run first


def test_low_precision_is_skipped_with_the_reason_where_there_is_no_bf16() -> None:
    result = d.diagnose(figures(run_dtype_speedup=1.0, native_bf16=0.0, bf16_speedup=0.01))
    assert "low_precision_unused" not in [b["kind"] for b in result["bottlenecks"]]
    (skip,) = [s for s in result["skipped"] if s["rule"] == "low_precision_unused"]
    assert "no native bf16" in skip["reason"]


def test_compute_bound_only_when_nothing_else_explains_the_step() -> None:
    assert kinds(figures(mfu=5.0)) == ["compute_bound"]
    assert kinds(figures(mfu=5.0, data_wait=d.INPUT_SHARE + 1)) == ["input_bound"]


def test_a_rule_without_its_figures_is_skipped_not_guessed() -> None:
    result = d.diagnose(figures(comm_exposed=math.nan))
    assert {"rule": "comm_bound", "reason": "one rank: nothing is communicated"} in result["skipped"]
    result = d.diagnose(figures(thread_demand=math.nan))
    assert {"rule": "cpu_oversubscribed", "reason": "not measured in this run: thread_demand"} in result["skipped"]


def test_expected_gain_is_amdahl_over_the_measured_shares() -> None:
    f = figures(data_wait=50.0, share__data=50.0, share__forward=20.0, share__backward=30.0)
    workers = Candidate(set={"switches.dataloader.num_workers": 2}, effects=(Effect("data", "shrinks", 0.8, 1.0),))
    tps = expected(workers, f)["tokens_per_s"]
    assert tps["low"] == pytest.approx(100 * (1 / (1 - 0.5 * 0.8) - 1))  # +66.7%
    assert tps["high"] == pytest.approx(100.0)  # the whole data wait removed: 2x
    grows = Candidate(set={"switches.activation_checkpointing.mode": "full"},
                      effects=(Effect("backward", "grows", 0.3, 0.45), Effect("peak_memory", "shrinks", 0.5, 0.75)))
    exp = expected(grows, f)
    assert exp["tokens_per_s"]["low"] == pytest.approx(100 * (1 / (1 + 0.3 * 0.45) - 1))
    assert exp["tokens_per_s"]["high"] == pytest.approx(100 * (1 / (1 + 0.3 * 0.3) - 1))
    assert (exp["peak_memory"]["low"], exp["peak_memory"]["high"]) == (pytest.approx(-75.0), pytest.approx(-50.0))


@pytest.mark.parametrize(("setting", "figure", "phase"), [
    ({"switches.parallel.reshard_after_forward": False}, "comm_exposed__all_gather", "backward"),
    ({"switches.parallel.microbatches": 4}, "comm_exposed__send_recv", "forward")])
def test_a_layout_lever_removes_part_of_the_exposed_collective_it_addresses(setting: dict, figure: str,
                                                                            phase: str) -> None:
    """The exposed time sits inside its phase: the phase loses (exposed / phase share) x the fraction,
    so the step loses the exposed share x the fraction, whatever the phase's share."""
    from optimizers.parallel import OPTIMIZATION

    (candidate,) = [c for c in OPTIMIZATION.candidates if set(c.set) == set(setting)]
    (effect,) = candidate.effects
    tps = expected(candidate, figures(**{figure: 12.0, f"share__{phase}": 60.0}))["tokens_per_s"]
    assert tps["low"] == pytest.approx(100 * (1 / (1 - 0.12 * effect.low) - 1))
    assert tps["high"] == pytest.approx(100 * (1 / (1 - 0.12 * effect.high) - 1))
    assert expected(candidate, figures())["tokens_per_s"]["high"] == pytest.approx(0.0)  # nothing exposed
    # a pipeline times its whole schedule as forward: no backward share to find the exposed time in
    assert expected(candidate, figures(**{figure: 12.0, f"share__{phase}": 0.0}))["tokens_per_s"]["high"] == 0.0


def test_the_comm_finding_names_the_exposed_collectives_largest_first() -> None:
    f = figures(comm_exposed=30.0, comm_overlap=5.0, comm_mib_per_step=1.5, comm_exposed__send_recv=22.0,
                comm_exposed__all_reduce=8.0)
    (finding,) = [b for b in d.diagnose(f)["bottlenecks"] if b["kind"] == "comm_bound"]
    assert finding["message"] == ("30.0% of the step waits on communication: send_recv 22.0%, all_reduce 8.0% "
                                  "(1.50 MiB a step, 5% overlapped)")
    assert set(finding["evidence"]) == {"comm_exposed", "comm_exposed.send_recv", "comm_exposed.all_reduce"}


def test_a_speedup_effect_uses_the_measured_matmul_share_and_peak_ratio() -> None:
    f = figures(share__forward=40.0, share__backward=60.0, matmul_share=50.0, bf16_speedup=2.0,
                run_dtype_speedup=1.0)  # from fp32
    bf16 = Candidate(set={"switches.amp.dtype": "bf16"},
                     effects=(Effect("forward", "shrinks", 0.5, 0.85, scales_with="bf16_matmul_speedup"),
                              Effect("backward", "shrinks", 0.5, 0.85, scales_with="bf16_matmul_speedup")))
    tps = expected(bf16, f)["tokens_per_s"]
    # compute is the whole step; matmuls are half of it (0.8-1.0 of that), and run 2x faster
    assert tps["high"] == pytest.approx(100 * (1 / (1 - 0.5 * 0.5) - 1))
    assert tps["low"] == pytest.approx(100 * (1 / (1 - 0.4 * 0.5) - 1))


def test_back_to_fp32_wins_back_what_the_emulated_dtype_loses_and_nothing_where_it_is_faster() -> None:
    from optimizers.amp import _FP32

    slow = figures(share__forward=40.0, share__backward=60.0, matmul_share=50.0, run_dtype_speedup=0.25)
    tps = expected(_FP32, slow)["tokens_per_s"]
    # matmuls, half the step, run at 0.25x fp32: back in fp32 they lose 75% of their time
    assert tps["high"] == pytest.approx(100 * (1 / (1 - 0.5 * 0.75) - 1))
    assert tps["low"] == pytest.approx(100 * (1 / (1 - 0.4 * 0.75) - 1))
    fast = figures(share__forward=40.0, share__backward=60.0, matmul_share=50.0, run_dtype_speedup=1.5)
    assert expected(_FP32, fast)["tokens_per_s"]["high"] == pytest.approx(0.0)


def test_a_half_dtype_is_judged_against_the_runs_own_dtype_not_fp32() -> None:
    from optimizers.amp import OPTIMIZATION

    to_fp16 = next(c for c in OPTIMIZATION.candidates
                   if c.set == {"switches.amp.dtype": "fp16"} and c.applies(type("C", (), {"dtype": "bf16"})))
    assert all(e.target != "peak_memory" for e in to_fp16.effects)  # both are two bytes
    # a GPU running bf16 and fp16 alike (H200: both ~14x fp32 at the run's shapes): nothing to gain
    alike = figures(share__forward=40.0, share__backward=60.0, matmul_share=50.0, bf16_speedup=14.0,
                    fp16_speedup=14.5, run_dtype_speedup=14.0)
    assert expected(to_fp16, alike)["tokens_per_s"]["high"] == pytest.approx(0.0)
    # bf16 emulated (0.5x fp32) where fp16 runs 8x fp32: fp16 is 16x the run's matmuls
    emulated = figures(share__forward=40.0, share__backward=60.0, matmul_share=50.0, fp16_speedup=8.0,
                       run_dtype_speedup=0.5)
    assert expected(to_fp16, emulated)["tokens_per_s"]["high"] == pytest.approx(100 * (1 / (1 - 0.5 * 15 / 16) - 1))


def test_every_bottleneck_kind_has_a_rule() -> None:
    assert {str(r.kind) for r in (*d.RULES, d.COMPUTE_RULE)} == {str(k) for k in Bottleneck}


def test_docs_list_every_rule() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "diagnosis.md").read_text()
    for rule in (*d.RULES, d.COMPUTE_RULE):
        assert f"| `{rule.id}` |" in text, rule.id
