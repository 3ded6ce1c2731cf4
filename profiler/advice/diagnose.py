"""Diagnosis: what holds a run back, each finding a rule over measured figures, with its evidence.

A rule reads the analyzers' figures (profiler.analysis.analyze) and fires a `Finding` when its
figure passes its threshold: the bottleneck kind (optimizers.vocabulary.Bottleneck), a severity
(the share of the step time, or of the memory capacity, it explains: 0..1, used to rank), the
evidence (the figures it read, with units and where they are stored), the threshold and the rule
id (docs/diagnosis.md, which cites the public tool each threshold follows). A rule that cannot be
evaluated on a run (no GPU for clocks, no bf16 hardware, one rank) is listed as skipped with the
reason. A run with nothing past a threshold gets "no bottleneck found" and its biggest phase.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from optimizers.vocabulary import Bottleneck
from profiler.analysis.figures import Figures, known
from profiler.analysis.stability import MIN_STEPS, RISE_Z
from profiler.metrics import PHASES
from profiler.traces.collectives import KINDS as COLLECTIVES


@dataclass(frozen=True)
class Finding:
    kind: Bottleneck
    severity: float
    evidence: dict[str, dict[str, Any]]
    threshold: str
    rule: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "severity": self.severity, "evidence": self.evidence,
                "threshold": self.threshold, "rule": self.rule, "message": self.message}


@dataclass(frozen=True)
class Rule:
    """Fires `kind` when `severity(figures)` is positive; `needs` are the figures it reads."""

    kind: Bottleneck
    threshold: str
    needs: tuple[str, ...]
    severity: Callable[[Figures], float]
    message: Callable[[Figures], str]
    applies: Callable[[Figures], str | None] = field(default=lambda f: None)
    """The reason the rule cannot judge this run, or None."""
    also: tuple[str, ...] = ()
    """Figures cited as evidence when the run has them, not required."""
    unjudged: Callable[[Figures], str | None] = field(default=lambda f: None)
    """What part of the rule could not judge this run, or None; listed as skipped when the rule does not fire."""

    @property
    def id(self) -> str:
        return str(self.kind)


def v(figures: Figures, name: str) -> float:
    return figures[name].value if name in figures else math.nan


def _slow_steps(f: Figures) -> float:
    """The part of the step the other ranks wait for the slowest rank's longer steps."""
    return 1 - 1 / v(f, "straggler") if v(f, "straggler") > STRAGGLER_RATIO else 0.0


def _late(f: Figures) -> float:
    """The part of the step the others wait at the collectives a rank arrives at last (the trace's own rule,
    profiler.traces.collective_skew, named it: last at most of its calls, by over 5% of the median step)."""
    late = v(f, "late_skew_ms") / v(f, "step_ms")
    return min(1.0, late) if late > 0 else 0.0


def _straggler_message(f: Figures) -> str:
    if _slow_steps(f) >= _late(f):
        return f"rank {v(f, 'slowest_rank'):.0f}'s steps are {v(f, 'straggler'):.2f}x the median rank's"
    return (f"rank {v(f, 'late_rank'):.0f} arrives last at its {f['late_rank'].label or 'collectives'} "
            f"({v(f, 'late_share'):.0f}% of {v(f, 'late_calls'):.0f} calls, "
            f"median {v(f, 'late_skew_ms'):.1f} ms after the first: "
            f"{100 * _late(f):.0f}% of the step the others wait)")


def compute_share(f: Figures) -> float:
    """Forward plus backward, as a fraction of the step."""
    return (v(f, "share.forward") + v(f, "share.backward")) / 100


# -- thresholds (docs/diagnosis.md says where each comes from) ------------------------------
INPUT_SHARE = 10.0  # % of the step: TensorBoard plugin rule R1 says 0.05; see docs/diagnosis.md
TINY_OPS = 40.0  # % of operator time in calls under 10 us (ours; HTA's launch-overhead cut, on the CPU)
DEVICE_BUSY = 50.0  # % of the step the GPU runs kernels: Nsight gpu_time_util, TB plugin R5 (0.5)
MEMORY_USE = 90.0  # % of capacity: TensorBoard plugin rule R7 (peak > 0.9 x device memory)
COMM_SHARE = 10.0  # % of the step: TensorBoard plugin rule R4 (communication / step > 0.1)
OPTIMIZER_SHARE = 25.0  # % of the step (ours)
ATTENTION_SHARE = 30.0  # % of the step: attention's share of operator time x forward + backward (ours)
ATTENTION_FLOPS = 25.0  # % of the model's FLOPs in QK^T and AV: a long sequence, T >= ~2x the width (ours)
FUSED = 50.0  # % of attention time in SDPA kernels, below which attention runs unfused (ours)
LOW_PRECISION_SPEEDUP = 1.3  # x: measured bf16/fp32 matmul peak ratio worth switching for (ours)
MATMUL_SHARE = 20.0  # % of operator time in matmuls, below which precision hardly matters (ours)
EMULATED_SPEEDUP = 0.8  # x: the run's dtype peak over fp32 below which it is emulated (ours)
COMPUTE_SHARE = 80.0  # % of the step in forward + backward (ours)
LOW_MFU = 25.0  # % (ours)
CHECKPOINT_SHARE = 5.0  # % of the step (ours)
STRAGGLER_RATIO = 1.2  # x slowest rank's median step over the median rank's (ours)
OVERSUBSCRIPTION = 0.5  # threads beyond the cores (SageMaker Dataloader rule: workers vs cores); other
# processes' load is evidence, not a trigger: a shared runner's neighbours are not the run's setup
THROTTLED_SHARE = 10.0  # % of samples with a power or thermal clocks-event reason (ours)
BUSY_MACHINE = 50.0  # % of the CPU the run's threads wanted that other processes took (ours): the run could have
# run up to 2x faster on a quiet machine, so its timings are not its setup's


def _low_precision_gain(f: Figures) -> float:
    """The share of the step bf16 matmuls would remove: compute x matmul share x (1 - 1/speedup)."""
    return compute_share(f) * v(f, "matmul_share") / 100 * (1 - 1 / v(f, "bf16_speedup"))


def _bf16_applies(f: Figures) -> str | None:
    if v(f, "run_dtype_speedup") != 1.0:
        return "the run already uses low-precision matmuls"
    if math.isnan(v(f, "native_bf16")):
        return "not measured in this run: the device's bf16 support was not recorded"
    if v(f, "native_bf16") != 1.0:
        return "this device has no native bf16 matmuls (no avx512_bf16/amx_bf16, or CUDA capability < 8.0)"
    return None


def _attention(f: Figures) -> float:
    return v(f, "attention_share") / 100 * compute_share(f)


def _attention_bound(f: Figures) -> float:
    """Attention's share of the step, when it is large and the sequence's doing (its FLOP share is
    large, or not known) or its kernels' (unfused): a short-sequence run whose fast matmuls leave fused
    attention a large share of a small step has nothing long to shorten."""
    if 100 * _attention(f) < ATTENTION_SHARE:
        return 0.0
    long_sequence = not known(f, "attention_flop_share") or v(f, "attention_flop_share") >= ATTENTION_FLOPS
    return _attention(f) if long_sequence or v(f, "attention_fused_share") < FUSED else 0.0


def _attention_message(f: Figures) -> str:
    why = []
    if known(f, "attention_flop_share"):
        why.append(f"its QK^T and AV matmuls are {v(f, 'attention_flop_share'):.0f}% of the model's FLOPs")
    if v(f, "attention_fused_share") < FUSED:
        why.append(f"{100 - v(f, 'attention_fused_share'):.0f}% of it runs unfused (no SDPA kernel)")
    return (f"attention is {v(f, 'attention_share'):.0f}% of operator time, about {100 * _attention(f):.0f}% of the "
            "step" + (": " + "; ".join(why) if why else ""))


def _comm_message(f: Figures) -> str:
    kinds = sorted(((v(f, f"comm_exposed.{k}"), k) for k in COLLECTIVES if known(f, f"comm_exposed.{k}")), reverse=True)
    if not known(f, "comm_mib_per_step"):  # GPU traces: the kinds (shares of the step) as parts of the exposed time
        total = sum(share for share, _ in kinds)
        parts = ", ".join(f"{kind} {100 * share / total:.1f}%" for share, kind in kinds) if total > 0 else ""
        head = (f"{v(f, 'comm_exposed'):.1f}% of the GPU's time is NCCL communication no computation overlaps "
                f"({v(f, 'comm_overlap'):.0f}% of it overlapped)")
        return head + (f"; of that exposed time: {parts}" if parts else "")
    by_kind = ": " + ", ".join(f"{kind} {share:.1f}%" for share, kind in kinds) if kinds else ""
    what = "communication" + by_kind if kinds else "all-reduce"
    return (f"{v(f, 'comm_exposed'):.1f}% of the step waits on {what} "
            f"({v(f, 'comm_mib_per_step'):.2f} MiB a step, {v(f, 'comm_overlap'):.0f}% overlapped)")


def host_bound(f: Figures) -> float:
    """CUDA: the idle share of the step that waiting for data does not explain; CPU: the share of
    forward, backward and optimizer in operator calls under 10 us."""
    if known(f, "gpu_idle", "host_wait"):  # traces: the idle time spent waiting for the host's launches
        return v(f, "gpu_idle") / 100 * v(f, "host_wait") / 100 if v(f, "device_busy") < DEVICE_BUSY else 0.0
    if known(f, "device_busy"):
        idle = 1 - v(f, "device_busy") / 100 - v(f, "data_wait") / 100
        return max(0.0, idle) if v(f, "device_busy") < DEVICE_BUSY else 0.0
    op_share = compute_share(f) + v(f, "share.optimizer") / 100  # the phases whose operators were counted
    return v(f, "tiny_op_share") / 100 * op_share if v(f, "tiny_op_share") >= TINY_OPS else 0.0


def _host_message(f: Figures) -> str:
    if known(f, "gpu_idle", "host_wait"):  # traces: HTA's idle time breakdown and launch statistics
        return (f"the GPU is idle {v(f, 'gpu_idle'):.0f}% of its time, {v(f, 'host_wait'):.0f}% of it waiting for the "
                f"host to launch the next kernel; {v(f, 'short_kernels'):.0f}% of kernels run shorter than the call "
                f"that launched them (median launch delay {v(f, 'launch_delay'):.0f} us from launch to start, queueing "
                f"included): the host cannot feed it")
    if known(f, "device_busy"):
        return f"the GPU runs kernels only {v(f, 'device_busy'):.0f}% of the step: the host cannot feed it"
    return (f"{v(f, 'tiny_op_share'):.0f}% of operator time is in calls under 10 us ({v(f, 'op_calls_per_step'):.0f} "
            "calls a step): the step is framework overhead, not arithmetic")


def rising(f: Figures) -> bool:
    """The loss rose beyond its own noise (profiler.analysis.stability: last third against first third
    of the counted steps, over RISE_Z standard errors); False where it was not judged (too few steps)."""
    return known(f, "loss_rise", "loss_rise_bound") and v(f, "loss_rise") > v(f, "loss_rise_bound")


def _unstable(f: Figures) -> float:
    """1 with a non-finite value; else the share of counted steps affected: skipped, spiked, with an
    outlying grad norm, or (when the loss rose beyond its noise) above the first third's loss plus the bound."""
    if v(f, "non_finite") > 0:
        return 1.0  # the run trained on NaN/Inf or stopped: nothing else it measured counts
    steps = max(v(f, "steps_counted"), 1.0)
    counts = ("skipped_steps", "loss_spikes", "grad_norm_outliers", *(("risen_steps",) if rising(f) else ()))
    affected = sum(0.0 if math.isnan(v(f, n)) else v(f, n) for n in counts)
    return min(1.0, affected / steps)


def _rise_text(f: Figures) -> str:
    steps = v(f, "loss_steps")
    if not known(f, "loss_rise", "loss_rise_bound"):
        return f"loss rise not judged: {0 if math.isnan(steps) else steps:.0f} counted step(s), fewer than {MIN_STEPS}"
    noise = f"bound {v(f, 'loss_rise_bound'):.2f}%: {RISE_Z:g} standard errors from step-to-step differences"
    change = f"loss {v(f, 'loss_rise'):+.2f}% from the first to the last third of {steps:.0f} counted steps"
    if rising(f):
        return f"{change}, beyond its noise ({noise}): {v(f, 'risen_steps'):.0f} step(s) above it"
    return f"{change}: no rise beyond its noise ({noise})"


def _unstable_unjudged(f: Figures) -> str | None:
    if known(f, "loss_rise", "loss_rise_bound"):
        return None
    return f"{_rise_text(f)} (non-finite values, skipped steps, spikes and grad-norm outliers were checked)"


RULES: tuple[Rule, ...] = (
    Rule(Bottleneck.UNSTABLE, "any non-finite loss or gradient, skipped step, loss spike or grad-norm outlier, "
         f"or a loss whose last third's mean is above its first third's by more than {RISE_Z:g} standard errors "
         f"(from step-to-step differences), judged over >= {MIN_STEPS} counted steps",
         ("non_finite", "steps_counted"), _unstable,
         lambda f: f"{v(f, 'non_finite'):.0f} non-finite event(s), {v(f, 'skipped_steps'):.0f} skipped step(s), "
                   f"{v(f, 'rollbacks'):.0f} rollback(s), {v(f, 'loss_spikes'):.0f} spike(s), "
                   f"{v(f, 'grad_norm_outliers'):.0f} grad-norm outlier(s); "
                   + _rise_text(f),
         unjudged=_unstable_unjudged,
         also=("skipped_steps", "rollbacks", "loss_spikes", "grad_norm_outliers", "loss_steps", "loss_rise",
               "loss_rise_bound", "risen_steps")),
    Rule(Bottleneck.MEMORY_BOUND, f"peak memory > {MEMORY_USE:g}% of the capacity",
         ("memory_use", "peak_memory", "memory_capacity"),
         lambda f: min(1.0, v(f, "memory_use") / 100) if v(f, "memory_use") > MEMORY_USE else 0.0,
         lambda f: f"peak {v(f, 'peak_memory'):.2f} GiB is {v(f, 'memory_use'):.0f}% of "
                   f"{v(f, 'memory_capacity'):.2f} GiB"),
    Rule(Bottleneck.INPUT_BOUND, f"data wait > {INPUT_SHARE:g}% of the step", ("data_wait", "data_wait_ms"),
         lambda f: v(f, "data_wait") / 100 if v(f, "data_wait") > INPUT_SHARE else 0.0,
         lambda f: f"steps wait {v(f, 'data_wait_ms'):.1f} ms for data: {v(f, 'data_wait'):.1f}% of the step"),
    Rule(Bottleneck.HOST_BOUND, f"CPU: >= {TINY_OPS:g}% of operator time in calls under 10 us; CUDA: the GPU "
         f"runs kernels < {DEVICE_BUSY:g}% of the step",
         ("tiny_op_share", "op_calls_per_step", "share.forward", "share.backward", "share.optimizer"), host_bound,
         _host_message,
         also=("device_busy", "data_wait", "gpu_idle", "host_wait", "launch_delay", "short_kernels")),
    Rule(Bottleneck.COMM_BOUND, f"exposed communication > {COMM_SHARE:g}% of the step", ("comm_exposed",),
         lambda f: v(f, "comm_exposed") / 100 if v(f, "comm_exposed") > COMM_SHARE else 0.0,
         _comm_message, applies=lambda f: None if known(f, "comm_exposed") else "one rank: nothing is communicated",
         also=tuple(f"comm_exposed.{kind}" for kind in COLLECTIVES)),
    Rule(Bottleneck.OPTIMIZER_BOUND, f"optimizer step > {OPTIMIZER_SHARE:g}% of the step", ("share.optimizer",),
         lambda f: v(f, "share.optimizer") / 100 if v(f, "share.optimizer") > OPTIMIZER_SHARE else 0.0,
         lambda f: f"the optimizer step takes {v(f, 'share.optimizer'):.1f}% of the step"),
    Rule(Bottleneck.ATTENTION_BOUND, f"attention operators >= {ATTENTION_SHARE:g}% of the step (their share of "
         f"operator time x forward + backward), with its matmuls >= {ATTENTION_FLOPS:g}% of the model's FLOPs "
         f"(where known) or < {FUSED:g}% of its time in fused SDPA kernels",
         ("attention_share", "share.forward", "share.backward"), _attention_bound, _attention_message,
         also=("attention_flop_share", "attention_fused_share")),
    Rule(Bottleneck.LOW_PRECISION_UNUSED, f"fp32 matmuls on a device whose bf16 matmul peak is >= "
         f"{LOW_PRECISION_SPEEDUP:g}x its fp32 one, with matmuls >= {MATMUL_SHARE:g}% of operator time",
         ("bf16_speedup", "matmul_share", "run_dtype_speedup", "native_bf16", "share.forward", "share.backward"),
         lambda f: _low_precision_gain(f) if v(f, "bf16_speedup") >= LOW_PRECISION_SPEEDUP
         and v(f, "matmul_share") >= MATMUL_SHARE else 0.0,
         lambda f: f"matmuls ({v(f, 'matmul_share'):.0f}% of operator time) run in fp32 while this device's bf16 "
                   f"matmuls are {v(f, 'bf16_speedup'):.2f}x faster: about {100 * _low_precision_gain(f):.0f}% of "
                   "the step", applies=_bf16_applies),
    Rule(Bottleneck.PRECISION_EMULATED, f"the run's matmul dtype peaks below {EMULATED_SPEEDUP:g}x fp32",
         ("run_dtype_speedup", "matmul_share", "share.forward", "share.backward"),
         lambda f: min(1.0, compute_share(f) * v(f, "matmul_share") / 100 * (1 - v(f, "run_dtype_speedup")))
         if v(f, "run_dtype_speedup") < EMULATED_SPEEDUP else 0.0,
         lambda f: f"the run's low-precision matmuls and attention run at {v(f, 'run_dtype_speedup'):.2f}x their fp32 "
                   "speed on this device" + (": emulated (no native bf16)" if v(f, "native_bf16") == 0 else
                                             " at the run's shapes: slower than fp32"),
         applies=lambda f: "the run's matmuls are fp32" if v(f, "run_dtype_speedup") == 1.0 else None),
    Rule(Bottleneck.CHECKPOINT_BOUND, f"checkpoint saving > {CHECKPOINT_SHARE:g}% of the step",
         ("share.checkpoint",),
         lambda f: v(f, "share.checkpoint") / 100 if v(f, "share.checkpoint") > CHECKPOINT_SHARE else 0.0,
         lambda f: f"saving checkpoints takes {v(f, 'share.checkpoint'):.1f}% of the run's step time"),
    Rule(Bottleneck.STRAGGLER, f"slowest rank's median step > {STRAGGLER_RATIO:g}x the median rank's, or one rank "
         "last at most of a collective's calls, the others waiting for it (an imported trace)",
         ("straggler",), lambda f: max(_slow_steps(f), _late(f)), _straggler_message,
         applies=lambda f: None if known(f, "straggler") else "one rank: no straggler to find",
         also=("late_rank", "late_calls", "late_share", "late_skew_ms", "step_ms")),
    Rule(Bottleneck.CPU_OVERSUBSCRIBED, f"torch threads + loader workers of the ranks of a host > its cores + "
         f"{OVERSUBSCRIPTION:g}", ("thread_demand", "cores"),
         lambda f: 1 - v(f, "cores") / v(f, "thread_demand")
         if v(f, "thread_demand") > v(f, "cores") + OVERSUBSCRIPTION else 0.0,
         lambda f: f"{v(f, 'thread_demand'):.0f} torch threads and loader workers on {v(f, 'cores'):.0f} cores "
                   f"(other processes kept {_others(f):.1f} cores busy meanwhile)", also=("other_cpu_busy",)),
    Rule(Bottleneck.THROTTLED, f"power or thermal clocks-event reasons in > {THROTTLED_SHARE:g}% of the samples",
         ("throttled",), lambda f: v(f, "throttled") / 100 if v(f, "throttled") > THROTTLED_SHARE else 0.0,
         lambda f: f"clocks held back in {v(f, 'throttled'):.0f}% of the samples "
                   f"(SM clock {v(f, 'sm_clock_drop'):.0f}% below its highest)",
         applies=lambda f: None if known(f, "throttled") else "no NVML samples: clocks are not measured on this "
                                                               "device"),
    Rule(Bottleneck.RECOMPILING, "torch.compile compiled again after the first step", ("recompiles",),
         lambda f: min(1.0, v(f, "recompiles") / max(v(f, "steps_counted"), 1.0)) if v(f, "recompiles") > 0 else 0.0,
         lambda f: f"{v(f, 'recompiles'):.0f} frame(s) compiled after the first step"),
)

COMPUTE_RULE = Rule(
    Bottleneck.COMPUTE_BOUND, f"no other bottleneck, forward + backward >= {COMPUTE_SHARE:g}% of the step and "
    f"MFU < {LOW_MFU:g}%", ("mfu", "share.forward", "share.backward"),
    lambda f: compute_share(f) * (1 - v(f, "mfu") / 100)
    if compute_share(f) * 100 >= COMPUTE_SHARE and v(f, "mfu") < LOW_MFU else 0.0,
    lambda f: f"the step is the model's arithmetic ({100 * compute_share(f):.0f}% forward + backward) at "
              f"{v(f, 'mfu'):.1f}% MFU: its kernels use the device poorly (small matrices)")
"""Judged last: low MFU is a bottleneck of its own only when nothing else explains the step."""


def _others(f: Figures) -> float:
    value = v(f, "other_cpu_busy")
    return 0.0 if math.isnan(value) else value


def _evidence(rule: Rule, figures: Figures) -> dict[str, dict[str, Any]]:
    return {n: figures[n].as_dict() for n in (*rule.needs, *rule.also) if n in figures}


def _judge(rule: Rule, figures: Figures) -> tuple[Finding | None, str | None]:
    """(a finding or None, the reason it was skipped or None)."""
    reason = rule.applies(figures)
    if reason is None and not known(figures, *rule.needs):
        missing = [n for n in rule.needs if not known(figures, n)]
        reason = f"not measured in this run: {', '.join(missing)}"
    if reason is not None:
        return None, reason
    severity = rule.severity(figures)
    if not severity > 0:
        return None, rule.unjudged(figures)
    return Finding(rule.kind, float(severity), _evidence(rule, figures), rule.threshold, rule.id,
                   rule.message(figures)), None


def not_representative(f: Figures) -> str | None:
    """Why the run's timings do not represent its setup (other processes took much of its CPU), or None."""
    if not v(f, "cpu_contention") >= BUSY_MACHINE:  # NaN (not measured: no CPU samples) is representative
        return None
    spread = f"; step p90 is {v(f, 'step_spread'):.1f}x p50" if known(f, "step_spread") else ""
    return (f"other processes kept {_others(f):.1f} of {v(f, 'cores'):.0f} cores busy during the run, "
            f"{v(f, 'cpu_contention'):.0f}% of the CPU its threads wanted{spread}: rerun on a quiet machine")


def diagnose(figures: Figures) -> dict[str, Any]:
    """{"bottlenecks": [finding, ...] by severity, "skipped": [{rule, reason}], "verdict": str,
    "representative": bool, and "not_representative": why, where it is not}."""
    found, skipped = [], []
    for rule in RULES:
        finding, reason = _judge(rule, figures)
        if finding is not None:
            found.append(finding)
        elif reason is not None:
            skipped.append({"rule": rule.id, "reason": reason})
    busy = not_representative(figures)
    if not found and busy is not None:  # low MFU on a machine others kept busy says nothing of the model
        skipped.append({"rule": COMPUTE_RULE.id, "reason": f"the run is not representative: {busy}"})
    elif not found:
        finding, _ = _judge(COMPUTE_RULE, figures)
        found += [finding] if finding is not None else []
    found.sort(key=lambda x: x.severity, reverse=True)
    result = {"bottlenecks": [x.as_dict() for x in found], "skipped": skipped,
              "verdict": verdict(found, figures), "representative": busy is None}
    return result if busy is None else {**result, "not_representative": busy}


def verdict(found: list[Finding], figures: Figures) -> str:
    """One line for people: the top bottleneck, or that none was found and where the time goes; first
    that the run is not representative, where it is not."""
    busy = not_representative(figures)
    return (f"not representative: {busy}. " if busy else "") + _finding_or_phase(found, figures)


def _finding_or_phase(found: list[Finding], figures: Figures) -> str:
    if found:
        top = found[0]
        return f"{top.kind}: {top.message}"
    shares = {p.name: v(figures, f"share.{p.name}") for p in PHASES}
    biggest = max((p for p in shares if not math.isnan(shares[p])), key=lambda p: shares[p], default=None)
    if biggest is None:
        return "no bottleneck found (too few steps were measured to say where the time goes)"
    return f"no bottleneck found: the biggest phase is {biggest} ({shares[biggest]:.0f}% of the step)"
