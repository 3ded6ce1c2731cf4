"""Recommendations: the switch changes that address a run's bottlenecks, each with a gain computed
from that run's own measurements.

What a switch addresses, what it needs and what each candidate change does are the catalog's facts
(optimizers: `Optimization.addresses`, `Candidate.effects/requires/risk`); this module only judges
them against a run:

- a candidate is proposed when its switch addresses a bottleneck found, it makes sense from the
  run's current setting (`applies`), the run has what it requires (capabilities decided from
  measured figures), the catalog's own checks accept the changed config on this device and world
  size, and, for changes that alter the model, only with `allow_model_changes`;
- its expected gain is Amdahl's law over the measured breakdown: each effect removes (or adds) a
  fraction of a phase's share of the step; tokens/s gains 1 / (1 - removed) - 1. An effect that
  scales with the bf16/fp16 matmul speedup uses the run's measured matmul share and the device's
  measured peak ratio; memory effects give the expected peak memory;
- ranked by severity of the bottleneck addressed x the expected gain in its metric (peak memory for
  memory_bound, throughput for the rest); a change whose expected gain is not positive is dropped.
"""

from __future__ import annotations

import functools
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from optimizers import REGISTRY, Candidate, ConfigError, Optimization
from optimizers.facts import Effect
from optimizers.vocabulary import Bottleneck, Capability
from profiler.advice.diagnose import LOW_PRECISION_SPEEDUP, host_bound, v
from profiler.analysis import RunData, analyze
from profiler.analysis.figures import Figures, known
from profiler.config import RunConfig, build_run_config, load_config
from profiler.instruments.machine import has_cuda
from profiler.metrics import PHASE_NAMES, lookup
from profiler.settings import override_texts

SPEEDUP_FIGURES = {"bf16_matmul_speedup": "bf16_speedup", "fp16_matmul_speedup": "fp16_speedup"}
MEMORY_KINDS = {Bottleneck.MEMORY_BOUND}
NO_SPEED_METRIC = {Bottleneck.UNSTABLE}
"""Bottlenecks whose remedies are judged by what they prevent, not by a speed or memory figure."""


def capabilities(run: RunData, figures: Figures, *, probing: bool = False) -> dict[Capability, tuple[bool, str]]:
    """Whether the run has each capability, and the evidence, decided from what was measured.

    `probing`: a probe will measure each change's speed on this machine, so a fast-matmul capability
    needs only the hardware (native bf16; a GPU for fp16), not the calibrated peak ratio, which can
    miss what the run's own shapes gain."""
    cuda = run.on_cuda
    bf16, fp16 = v(figures, "bf16_speedup"), v(figures, "fp16_speedup")
    cores, demand = v(figures, "cores"), v(figures, "thread_demand")
    fast_bf16 = v(figures, "native_bf16") == 1.0 and (probing or bf16 >= LOW_PRECISION_SPEEDUP)
    host = host_bound(figures)
    return {
        Capability.FAST_BF16_MATMUL: (fast_bf16, f"bf16 matmul peak {_x(bf16)} fp32, native bf16 "
                                                 f"{_yes(v(figures, 'native_bf16'))}"),
        Capability.FAST_FP16_MATMUL: (cuda and (probing or fp16 >= LOW_PRECISION_SPEEDUP),
                                      f"fp16 matmul peak {_x(fp16)} fp32"),
        Capability.FP16_OVER_BF16: (not fast_bf16 or fp16 >= LOW_PRECISION_SPEEDUP * bf16,
                                    f"fp16 matmuls {_x(fp16)} fp32 against bf16's {_x(bf16)}"),
        Capability.CUDA: (cuda, "the run's device"),
        Capability.SEVERAL_RANKS: (run.world_size > 1, f"{run.world_size} rank(s)"),
        Capability.SPARE_CORES: (not (demand >= cores), f"{demand:.0f} threads and workers on {cores:.0f} cores"),
        Capability.COMPILER: (True, "checked by the compile switch's own config check"),
        Capability.NOT_HOST_BOUND: (not host > 0, f"host_bound severity {host:.2f}"),
    }


def _x(ratio: float) -> str:
    return "not measured" if math.isnan(ratio) else f"{ratio:.2f}x"


def _yes(flag: float) -> str:
    return "not recorded" if math.isnan(flag) else ("yes" if flag == 1.0 else "no")


SOFT = {Capability.SPARE_CORES}
"""Capabilities whose absence lowers a gain instead of ruling the change out (a worker waiting on
I/O needs no core of its own)."""


def effect_fraction(effect: Effect, figures: Figures) -> tuple[float, float]:
    """The effect's (low, high) fraction of its target, with this run's measured figures."""
    if effect.scales_with in SPEEDUP_FIGURES:
        # over the run's own dtype: bf16 -> fp16 on a GPU that runs both alike gains nothing
        run_dtype = v(figures, "run_dtype_speedup")
        speedup = v(figures, SPEEDUP_FIGURES[effect.scales_with]) / (1.0 if math.isnan(run_dtype) else run_dtype)
        if math.isnan(speedup):
            return math.nan, math.nan
        if speedup < LOW_PRECISION_SPEEDUP:
            return 0.0, 0.0  # within what the run's dtype already gives: not worth a numerics change
        share = v(figures, "matmul_share") / 100  # measured; the catalog's range is the prior
        low, high = (0.8 * share, share) if not math.isnan(share) else (effect.low, effect.high)
        return low * (1 - 1 / speedup), high * (1 - 1 / speedup)
    if effect.scales_with == "run_dtype_speedup":
        speedup, share = v(figures, "run_dtype_speedup"), v(figures, "matmul_share") / 100
        if math.isnan(speedup) or math.isnan(share) or speedup >= 1:
            return 0.0, 0.0  # fp32 already, or its dtype is the faster one: nothing to win back
        return 0.8 * share * (1 - speedup), share * (1 - speedup)
    if effect.scales_with.startswith("comm_exposed."):  # exposed time inside the target phase, as its share
        phase = v(figures, f"share.{effect.target}")  # 0 where nothing is timed there (a pipeline's backward)
        share = v(figures, effect.scales_with) / phase if phase > 0 else math.nan
        return (effect.low * min(share, 1.0), effect.high * min(share, 1.0)) if math.isfinite(share) else (0.0, 0.0)
    if effect.scales_with == "attention_share":
        return effect.fraction({"attention_share": v(figures, "attention_share") / 100})
    low, high = effect.fraction({})
    step_memory = v(figures, "step_memory") / 100
    if effect.target == "peak_memory" and effect.change == "shrinks" and math.isfinite(step_memory):
        return low * step_memory, high * step_memory  # only what the steps add can be freed
    return low, high


def _percent(low: float, high: float) -> str:
    return f"{100 * low:.0f}%" if round(100 * low) == round(100 * high) else f"{100 * low:.0f}-{100 * high:.0f}%"


def expected(candidate: Candidate, figures: Figures) -> dict[str, Any]:
    """The expected change of throughput (and of peak memory) from the candidate's effects."""
    removed_low = removed_high = 0.0
    memory: tuple[float, float] | None = None
    basis = []
    for effect in candidate.effects:
        low, high = effect_fraction(effect, figures)
        if math.isnan(low):
            continue
        sign = 1 if effect.change == "shrinks" else -1
        if effect.target in PHASE_NAMES:
            share = v(figures, f"share.{effect.target}") / 100
            if math.isnan(share) or share == 0:
                continue
            a, b = sign * share * low, sign * share * high
            removed_low, removed_high = removed_low + min(a, b), removed_high + max(a, b)
            basis.append(f"{effect.target} {100 * share:.0f}% of the step, {effect.change} by {_percent(low, high)}")
        elif effect.target == "peak_memory" and known(figures, "peak_memory"):
            memory = (min(-sign * low, -sign * high), max(-sign * low, -sign * high))
            held = f" (only the {v(figures, 'step_memory'):.0f}% of it the steps add can be freed)" \
                if known(figures, "step_memory") and sign > 0 else ""
            basis.append(f"peak memory {effect.change} by {_percent(low, high)}{held}")
    out: dict[str, Any] = {"tokens_per_s": {"low": 100 * (1 / (1 - removed_low) - 1),
                                            "high": 100 * (1 / (1 - removed_high) - 1), "unit": "%"}}
    if memory is not None:
        peak = v(figures, "peak_memory")
        out["peak_memory"] = {"low": 100 * memory[0], "high": 100 * memory[1], "unit": "%",
                              "from_gib": peak, "to_gib": [peak * (1 + memory[0]), peak * (1 + memory[1])]}
    out["basis"] = "Amdahl: " + "; ".join(basis) if basis else candidate.note
    return out


def judged_by(kind: Bottleneck) -> str:
    """What a remedy for `kind` is judged by: peak memory, steadier training, or throughput."""
    return "stability" if kind in NO_SPEED_METRIC else "peak_memory" if kind in MEMORY_KINDS else "tokens_per_s"


def _gain(kind: Bottleneck, exp: Mapping[str, Any]) -> float:
    """The candidate's gain for `kind`, as a fraction, judged by the middle of its range."""
    if kind in MEMORY_KINDS:
        mem = exp.get("peak_memory")
        return -(mem["low"] + mem["high"]) / 200 if mem else 0.0
    tps = exp["tokens_per_s"]
    return tps.get("point", (tps["low"] + tps["high"]) / 2) / 100  # a probe's measured point, else the middle


def score_of(kinds: Sequence[Bottleneck], severity: Mapping[Bottleneck, float], exp: Mapping[str, Any]
             ) -> tuple[float, Bottleneck]:
    """A change's rank and the bottleneck it is for: the severity of each kind it addresses x its expected
    gain there (a fixed half for remedies judged by stability), the best of them."""
    scored = [(severity[k] * _gain(k, exp), k) for k in kinds if k not in NO_SPEED_METRIC]
    scored += [(severity[k] * 0.5, k) for k in kinds if k in NO_SPEED_METRIC]
    return max(scored)


def severities(diagnosis: Mapping[str, Any]) -> dict[Bottleneck, float]:
    """The diagnosed bottlenecks' severities, by kind."""
    return {Bottleneck[b["kind"].upper()]: b["severity"] for b in diagnosis["bottlenecks"]}


def _current(config: Mapping[str, Any]):
    def get(key: str) -> Any:
        return lookup(config, key)
    return get


def unmet(candidate: Candidate, caps: Mapping[Capability, tuple[bool, str]], allow_model_changes: bool
          ) -> str | None:
    """Why the run cannot take the candidate whatever its config says (a model change not asked for, a
    capability it lacks), or None."""
    if candidate.risk == "changes_model" and not allow_model_changes:
        return "changes the model (listed with --allow-model-changes)"
    missing = [f"{c} ({caps[c][1]})" for c in candidate.requires if c not in SOFT and not caps[c][0]]
    return "needs " + ", ".join(missing) if missing else None


def proposal(switch: str | None, candidate: Candidate, settings: Mapping[str, Any], kinds: Sequence[Bottleneck],
             severity: Mapping[Bottleneck, float], exp: dict[str, Any],
             caps: Mapping[Capability, tuple[bool, str]]) -> dict[str, Any]:
    """A recommendation as every reader takes it (the catalog's, or one in a framework's terms): what it
    sets, the bottleneck it is for, its score, expected range, risk and notes. A change without a
    modelled range scores 0, for the most severe bottleneck it addresses."""
    score, kind = score_of(kinds, severity, exp) if "tokens_per_s" in exp else \
        (0.0, max(kinds, key=severity.__getitem__))
    notes = [candidate.note] if candidate.note else []
    soft = [f"{c}: {caps[c][1]}" for c in candidate.requires if c in SOFT and not caps[c][0]]
    if soft:
        notes.append("missing " + "; ".join(soft) + " (the gain may be smaller)")
    return {"switch": switch, "set": dict(settings), "addresses": [str(k) for k in kinds], "for": str(kind),
            "judged_by": judged_by(kind), "score": score, "expected": exp, "risk": candidate.risk, "notes": notes}


def no_gain(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The exclusion of a proposal whose expected gain is not positive."""
    return {"switch": rec["switch"], "set": rec["set"], "reason": f"no expected gain on this run "
                                                                  f"({rec['expected']['basis']})"}


def command(run: RunData, settings: Mapping[str, Any]) -> str:
    """The profile-run line that reruns this run with the change."""
    args = ["profile-run", "--from-run", str(run.path)]
    if run.world_size > 1:
        args += ["--nproc", str(run.world_size)]
    for text in override_texts(settings):
        args += ["--set", text]
    return shlex.join(args)


def recommend(run: RunData, figures: Figures, diagnosis: Mapping[str, Any], *, allow_model_changes: bool = False,
              top: int | None = None, probing: bool = False) -> dict[str, Any]:
    """{"recommendations": [...] ranked, "excluded": [{switch, set, reason}]} for a diagnosed run."""
    if run.own_model:  # no config of ours (an imported trace; a user's own training is advised
        return {"recommendations": [], "excluded": [],  # in its framework's terms: profiler.advice.framework)
                "not_recommended": f"the run's model is its own ({run.source} run): the switches are the reference "
                                   "trainer's, so the diagnosis stands without a switch to flip"}
    severity = severities(diagnosis)
    caps = capabilities(run, figures, probing=probing)
    cfg = build_run_config(run.config)
    planned_now = functools.cache(lambda: _per_rank_bytes(cfg, run.world_size))  # once, if a layout changes
    full = cfg.to_dict()  # the run's config with every default: a run recorded before a switch existed has it
    current = _current(full)
    ranked: list[dict[str, Any]] = []
    excluded: list[dict[str, Any]] = []
    for opt in REGISTRY:
        kinds = [k for k in opt.addresses if k in severity]
        for candidate in opt.candidates if kinds else ():
            settings = candidate.resolve(current)
            reason = _exclusion(opt, candidate, cfg, full, run, caps, settings, allow_model_changes)
            if reason == "":
                continue  # already what the run does: not worth a line
            if not reason and candidate.probe_only and not probing:
                reason = f"not modelled: {candidate.note}"
            if reason:
                excluded.append({"switch": opt.name, "set": dict(settings), "reason": reason})
                continue
            rec = proposal(opt.name, candidate, settings, kinds, severity,
                           {**expected(candidate, figures), "source": "modelled"}, caps)
            if rec["score"] <= 0 and not probing:  # a probe measures what the model cannot see
                excluded.append(no_gain(rec))
                continue
            planned = _planned(planned_now, run, settings)
            rec["notes"] += [planned] if planned else []
            ranked.append({**rec, "command": command(run, settings)})
    ranked.sort(key=lambda r: r["score"], reverse=True)
    return {"recommendations": ranked[:top] if top else ranked, "excluded": excluded}


def _per_rank_bytes(cfg: RunConfig, world_size: int) -> dict[str, int]:
    """What `glmperf plan` computes a rank of `cfg` holds, by part."""
    from profiler.advice.plan import plan  # here: it builds the model (torch), which other advice needs not

    return plan(cfg, world_size).per_rank_bytes


def _planned(planned_now: Callable[[], dict[str, int]], run: RunData, settings: Mapping[str, Any]) -> str | None:
    """What `glmperf plan` computes a rank holds before and after a change of parallel layout (None for
    other changes): the memory a sharding recommendation saves, for this run's model and batch."""
    if not any(key.startswith("switches.parallel.") for key in settings):
        return None
    after = load_config(base=run.config, overrides=override_texts(settings), nproc=run.world_size, check_here=False)
    old, new = planned_now(), _per_rank_bytes(after, run.world_size)
    change = ", ".join(f"{part} {old[part] / 2**20:,.1f} -> {new[part] / 2**20:,.1f}"
                       for part in ("params", "grads", "optimizer", "activations", "buffers") if old[part] != new[part])
    return (f"`glmperf plan`: {old['total'] / 2**20:,.1f} -> {new['total'] / 2**20:,.1f} MiB a rank "
            f"({new['total'] / old['total'] - 1:+.0%}; {change or 'no part changes'} MiB)")


def _exclusion(opt: Optimization, candidate: Candidate, cfg: Any, full: Mapping[str, Any], run: RunData,
               caps: Mapping[Capability, tuple[bool, str]], settings: Mapping[str, Any],
               allow_model_changes: bool) -> str | None:
    """Why the candidate is not proposed ('' when the run already does it), or None. `full`: the run's
    config with every default."""
    if not candidate.applies(getattr(cfg.switches, opt.name)):
        return ""
    if all(lookup(full, k) == value for k, value in settings.items()):
        return ""
    unfit = unmet(candidate, caps, allow_model_changes)
    if unfit:
        return unfit
    if run.on_cuda and not has_cuda():
        return None  # the catalog's checks judge the run's own device, which this machine lacks
    try:
        load_config(base=run.config, overrides=override_texts(settings), nproc=run.world_size)
    except ConfigError as exc:
        return f"cannot run here: {exc}"
    return None


COMPUTE_ASSUMED = {"bottlenecks": [{"kind": str(Bottleneck.COMPUTE_BOUND), "severity": 1.0}]}
"""The diagnosis `explore` ranks changes against: the step taken as compute bound."""
SPEED_ASSUMED = {"bottlenecks": [{"kind": str(k), "severity": 1.0} for k in Bottleneck
                                 if k not in MEMORY_KINDS | NO_SPEED_METRIC]}
"""What `explore` ranks changes against when each is probed: every bottleneck a speed change can
relieve, so a careful engineer's list (fused optimizer, loader workers, ...) is tried, not only compute's."""


def explore(run: RunData, figures: Figures | None = None, *, allow_model_changes: bool = False,
            top: int | None = None, probing: bool = False) -> dict[str, Any]:
    """What could still speed up a run, whatever its diagnosis: the changes that make its compute
    faster, ranked by expected gain as if the step were compute bound (for `glmperf tune`, which
    verifies each before adopting it). `probing`: every speed change the run can take, since a probe
    will measure which pay; never one that changes the optimization itself (the global batch, the
    schedule), which a speed gain does not justify."""
    figures = analyze(run) if figures is None else figures
    assumed = SPEED_ASSUMED if probing else COMPUTE_ASSUMED
    advice = recommend(run, figures, assumed, allow_model_changes=allow_model_changes, probing=probing)
    kept = [{**r, "for": str(Bottleneck.COMPUTE_BOUND) if str(Bottleneck.COMPUTE_BOUND) in r["addresses"]
             else r["addresses"][0]} for r in advice["recommendations"] if r["risk"] != "convergence"]
    return {**advice, "recommendations": kept[:top] if top else kept}
