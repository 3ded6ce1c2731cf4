"""Prove the advice: rerun a run's config and its recommendations side by side, and judge each by the
statistics of `glmperf compare` (profiler.compare.stats).

    trials = trials_for(run, recommendations, repeats=3, steps=30)
    for cell, run_dir in run_cells(trials.cells, runs_dir=...): ...
    verification = judge_trials(trials, stored runs by trial)

The baseline is a fresh run of the verified run's own config, not the old run (the machine may have
changed); each recommendation is the same config with its `set`, and, when there are several, all
compatible ones together. Runs are interleaved (baseline, each candidate, baseline, ...), so a
machine that gets busier slows every side alike, and the runs are the unit of the statistics.

A recommendation is judged by what it was made for (`judged_by`): tokens/s, peak memory, or, for
stability remedies, the stability events it should remove. Verdicts:

- `changes_numerics`: the loss curves part beyond compare's loss-parity tolerance (same seed and
  data give another curve), whatever it does to speed;
- `confirmed`: better by more than MIN_GAIN with the comparison's confidence;
- `refuted`: worse, within MIN_GAIN either way, or an interval that rules out a gain of MIN_GAIN;
  also a changed run that failed;
- `inconclusive`: the noise allows both; says about how many repeats would decide.

Sequential testing: profiler.experiments.sequential.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiler import store
from profiler.analysis import RunData, RunRecord, analyze, load_run, summary_of
from profiler.compare.gate import DEFAULT_REPORTED, LOSS_PARITY, Gate, Threshold
from profiler.compare.runs import compare
from profiler.compare.stats import Options
from profiler.config import RunConfig, load_config
from profiler.experiments.batch import Cell, traced_once
from profiler.experiments.records import canonical
from profiler.metrics import METRIC_BY_NAME, PHASE_NAMES
from profiler.settings import override_texts

MIN_GAIN = 0.02
"""A change must be at least 2% better, with confidence, to be confirmed; below that it is no gain."""
STABILITY_EVENTS = ("non_finite", "skipped_steps", "loss_spikes", "grad_norm_outliers")
COMBINED = "all together"
CONFIDENCE = Options().confidence
"""compare's confidence (99%), held by a verification over all its looks together."""
STOPS = ("decided", "max_repeats", "time_budget", "not_measured", "interrupted")
"""Why a trial's repeats stopped (a result's `stopped`): its verdict was decided; `most` repeats ran and
it is still inconclusive; another repeat would overrun the caller's time budget; nothing to judge
came out of its runs (its baseline failed); Ctrl-C."""


@dataclass(frozen=True)
class Trial:
    """One side of a verification: the baseline, a recommendation, or all of them together."""

    label: str
    recommendation: Mapping[str, Any] | None
    """None for the baseline."""
    cfg: RunConfig | None
    """None: a trial of the user's own command (profiler.experiments.rerun), which makes its own cells."""


@dataclass(frozen=True)
class Trials:
    """What verifying a run's advice runs: the trials, the refused ones, and their interleaved cells."""

    verified: str
    """The id of the run the advice is for."""
    trials: tuple[Trial, ...]
    refused: tuple[dict[str, Any], ...]
    """Candidate configs that cannot run (the combination of two changes that conflict), with why."""
    cells: tuple[Any, ...]
    """The interleaved runs: batch.Cell, or rerun.CommandCell for a trial of the user's command."""
    repeats: int
    steps: int
    nproc: int = 1


def _combined(recommendations: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The recommendations' changes merged, or None when two set one key differently."""
    merged: dict[str, Any] = {}
    for rec in recommendations:
        for key, value in canonical(rec["set"]).items():  # a shorthand and its field's full name are one key
            if merged.get(key, value) != value:
                return None
            merged[key] = value
    return merged


def trials_for(run: RunData, recommendations: Sequence[Mapping[str, Any]], *, repeats: int, steps: int,
               name: str | None = None) -> Trials:
    """The trials and their interleaved cells; a config the catalog rejects is refused up front."""
    base_over = [f"train.steps={steps}"]
    label = name or str(run.name or run.id)
    nproc = run.world_size
    trials = [Trial("baseline", None, load_config(base=run.config, overrides=[*base_over, f"name={label}.base"],
                                                  nproc=nproc))]
    refused: list[dict[str, Any]] = []
    wanted = [(str(r["switch"]), r) for r in recommendations]
    merged = _combined(recommendations) if len(recommendations) > 1 else None
    if len(recommendations) > 1 and merged is None:
        refused.append({"label": COMBINED, "reason": "two recommendations set one key differently"})
    if merged is not None:
        judged = {r["judged_by"] for r in recommendations}
        wanted.append((COMBINED, {"switch": COMBINED, "set": merged, "risk": worst_risk(recommendations),
                                  "judged_by": judged.pop() if len(judged) == 1 else "tokens_per_s",
                                  "expected": None, "for": "all"}))
    for trial_label, rec in wanted:
        try:
            cfg = load_config(base=run.config, overrides=[*base_over, *override_texts(rec["set"]),
                                                          f"name={label}.{trial_label.replace(' ', '-')}"],
                              nproc=nproc)
        except ValueError as exc:
            refused.append({"label": trial_label, "reason": f"cannot run here: {exc}"})
            continue
        trials.append(Trial(trial_label, rec, cfg))
    cells = tuple(c for r in range(repeats) for c in _repeat(trials, run.id, nproc, r, repeats))
    return Trials(run.id, tuple(trials), tuple(refused), cells, repeats, steps, nproc)


def _repeat(trials: Sequence[Trial], verified: str, nproc: int, repeat: int, of: int) -> list[Cell]:
    return [Cell(f"{t.label} (repeat {repeat + 1}/{of})", traced_once(t.cfg, repeat), nproc=nproc,
                 links={"verifies": {"run": verified, "trial": t.label, "repeat": repeat}})
            for t in trials if t.cfg is not None]


def repeat_cells(trials: Trials, repeat: int, labels: Collection[str], *, of: int) -> tuple[Cell, ...]:
    """The cells of one more repeat (0-based `repeat`, of `of` at most) of the trials named in `labels`,
    in the plan's order (the baseline first)."""
    return tuple(_repeat([t for t in trials.trials if t.label in labels], trials.verified, trials.nproc,
                         repeat, of))


def worst_risk(recommendations: Sequence[Mapping[str, Any]]) -> str:
    """The gravest `risk` of the recommendations ("none" when they have none)."""
    order = ("none", "numerics", "convergence", "changes_model")
    return max((str(r.get("risk", "none")) for r in recommendations), key=order.index, default="none")


def _shares(runs: Sequence[RunData]) -> dict[str, float]:
    """Median phase shares of the step over the runs (%)."""
    values: dict[str, list[float]] = {p: [] for p in PHASE_NAMES}
    for run in runs:
        for phase, share in (summary_of(run).get("phase_share") or {}).items():
            if phase in values:
                values[phase].append(100 * float(share))
    return {p: float(sorted(v)[len(v) // 2]) for p, v in values.items() if v}


def _stability_events(run: RunData) -> int:
    figures = analyze(run)
    return int(sum(figures[k].value for k in STABILITY_EVENTS if k in figures and math.isfinite(figures[k].value)))


def _judge_stability(base: Sequence[RunData], cand: Sequence[RunData]) -> tuple[str, str, dict[str, Any]]:
    b, c = [_stability_events(r) for r in base], [_stability_events(r) for r in cand]
    measured = {"metric": "stability_events", "base": b, "cand": c}
    if sum(b) == 0:
        return "inconclusive", "the fresh baseline showed no instability to remove", measured
    if sum(c) == 0:
        return "confirmed", f"stability events {sum(b)} -> 0 over {len(c)} run(s)", measured
    if sum(c) >= sum(b):
        return "refuted", f"stability events {sum(b)} -> {sum(c)}: not fewer", measured
    return "inconclusive", f"stability events {sum(b)} -> {sum(c)}: fewer, not gone", measured


def _judge_speed(metric: str, base: Sequence[RunData], cand: Sequence[RunData], budget_gib: float | None,
                 confidence: float) -> tuple[str, str, dict[str, Any]]:
    m = METRIC_BY_NAME[metric]  # judged_by names a metric of the registry
    gate = Gate((Threshold(m.name, MIN_GAIN), Threshold(LOSS_PARITY, DEFAULT_REPORTED[LOSS_PARITY], gated=False)),
                Options(confidence=confidence))
    result = compare(list(base), list(cand), gate)
    e = result.metrics[0].estimate
    sign = 1 if m.better == "higher" else -1
    lo, hi = sorted((sign * e.ci[0], sign * e.ci[1]))
    measured: dict[str, Any] = {"metric": m.name, "unit": m.unit, "base": e.base, "cand": e.cand,
                                "change_pct": 100 * sign * e.change, "low_pct": 100 * lo, "high_pct": 100 * hi,
                                "confidence": result.options.confidence, "runs": list(e.runs),
                                "loss_parity": {"verdict": result.parity.verdict, "reason": result.parity.reason}}
    if e.repeats_needed is not None:
        measured["repeats_needed"] = e.repeats_needed
    if m.name == "peak_memory" and budget_gib:
        measured["budget_gib"] = budget_gib
        measured["under_budget"] = bool(e.cand <= budget_gib)
    gain = "a gain" if m.better == "higher" else "a reduction"
    if result.parity.verdict == "drift":
        return "changes_numerics", result.parity.reason, measured
    if e.verdict == "improved":
        reason = f"{gain} of {100 * sign * e.change:.1f}% [{100 * lo:+.1f}%, {100 * hi:+.1f}%]"
        if "under_budget" in measured:
            where = "under" if measured["under_budget"] else "still above"
            reason += f"; peak {e.cand:.2f} GiB, {where} the {budget_gib:g} GiB budget"
        return "confirmed", reason, measured
    if e.verdict in ("regressed", "unchanged") or hi < MIN_GAIN:
        return "refuted", f"no {gain} of {100 * MIN_GAIN:g}% or more: measured {100 * sign * e.change:+.1f}% " \
                          f"[{100 * lo:+.1f}%, {100 * hi:+.1f}%]", measured
    return "inconclusive", e.reason, measured


def judge(trial: Trial, base: Sequence[RunData], cand: Sequence[RunData], *, budget_gib: float | None = None,
          confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The verdict on one trial from its stored runs and the baseline's, its interval read at `confidence`."""
    rec = trial.recommendation or {}
    out: dict[str, Any] = {"switch": rec.get("switch"), "set": dict(rec.get("set") or {}),
                           "judged_by": rec.get("judged_by"), "expected": rec.get("expected"),
                           "risk": rec.get("risk"), "runs": [r.id for r in cand]}
    stopped = any(r.status == "interrupted" for r in cand)
    cand = [r for r in cand if r.status != "interrupted"]  # a Ctrl-C says nothing of the change
    failed = [r for r in cand if r.status != "completed"]
    done_base = [r for r in base if r.status == "completed"]
    if failed:
        err = failed[0].error or failed[0].status
        return {**out, "verdict": "refuted", "reason": f"the changed run did not complete: {err}"}
    if not cand or not done_base:
        why = "interrupted before a changed run completed" if stopped else "not run (the plan was stopped before it)"
        return {**out, "verdict": "inconclusive", "reason": why}
    if rec.get("judged_by") == "stability":
        verdict, reason, measured = _judge_stability(done_base, cand)
    else:
        verdict, reason, measured = _judge_speed(str(rec.get("judged_by")), done_base, cand, budget_gib, confidence)
    measured["shares"] = {"baseline": _shares(done_base), "candidate": _shares(cand)}
    return {**out, "verdict": verdict, "reason": reason, "measured": measured}


def judge_trials(trials: Trials, runs: Mapping[str, Sequence[RunData]], *, budget_gib: float | None = None,
                 confidence: float = CONFIDENCE) -> dict[str, Any]:
    """run.json `diagnosis.verification` of the verified run, from each trial's stored runs (one look:
    `Sequential` adds repeats while a verdict is open)."""
    base = runs.get("baseline", [])
    results = [judge(t, base, runs.get(t.label, []), budget_gib=budget_gib, confidence=confidence)
               for t in trials.trials[1:]]
    return {"repeats": trials.repeats, "steps": trials.steps, "baseline_runs": [r.id for r in base],
            "results": results, "refused": list(trials.refused),
            "complete": all(len(runs.get(t.label, [])) == trials.repeats for t in trials.trials)}


def runs_of(trials: Trials, run_dirs: Sequence[tuple[Cell, Any]]) -> dict[str, list[RunData]]:
    """The stored runs of each trial, by label, from (cell, run directory) pairs."""
    out: dict[str, list[RunData]] = {}
    for cell, run_dir in run_dirs:
        out.setdefault(cell.links["verifies"]["trial"], []).append(load_run(run_dir))
    return out


def store_verification(run_dir: Any, verification: Mapping[str, Any], advice: Mapping[str, Any]) -> None:
    """Into the verified run's diagnosis (computed now when the run was stored without one)."""
    stored = RunRecord(Path(run_dir), store.read_run(run_dir))
    diagnosis = dict(stored.diagnosis or {k: v for k, v in advice.items() if k != "figures"})
    store.update_run(run_dir, diagnosis={**diagnosis, "verification": dict(verification)})
