"""`glmperf tune`: from a plain config to the fastest one the advice can prove, within a memory budget.

Each round diagnoses the newest run of the current config, takes the best recommendation not tried
yet (`order`; when the run has no bottleneck: the best change that makes compute faster, as
`explore` ranks them), and verifies it against a fresh run of the current config
(profiler.experiments.verify: interleaved repeats, compare's statistics). The verification starts
with `repeats` runs a side and adds one more pair while its verdict is open, up to `max_repeats`
(profiler.experiments.sequential: each look at a stricter confidence, Bonferroni over the looks, so looking
repeatedly does not make a false confirmation likelier). It is adopted when confirmed and its runs'
peak memory fits the budget; otherwise the round records why it was refused and the next
recommendation is tried. The rounds stop when nothing untried is recommended, the next round would
overrun the time budget, or after `max_rounds`. A change that alters the model is never tried
unless allowed.

Then one more round verifies the changes together (`combination`): the changes that stayed
inconclusive with a measured gain, added to the adopted config and judged against it (adopted when
confirmed, loss parity holding), or, when none did and two or more were adopted, the adopted config
against the starting one (the whole gain measured side by side; each change stays adopted, as each
was confirmed on top of those before it).

The record (`<runs_dir>/tunes/<id>/tune.json`) holds every round: what was diagnosed, what was
tried, the measured gain, the repeats it took and why they stopped, and the decision; the tuned
config is written as a YAML that `profile-run --config` takes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from profiler.advice.advise import advise
from profiler.advice.measured import ProbeBudget
from profiler.analysis import RunData, load_run, summary_of
from profiler.config import RunConfig
from profiler.experiments import records
from profiler.experiments.batch import Cell, run_cells
from profiler.experiments.sequential import Sequential
from profiler.experiments.verify import COMBINED, trials_for, worst_risk
from profiler.settings import settings_text

CONFIRMED = "confirmed"
DEFAULT_MAX_REPEATS = 6
"""Runs a side a verification may grow to (its looks: the starting repeats, and one per repeat added)."""


@dataclass(frozen=True)
class TuneSpec:
    """What to tune and within what: the starting config and the limits."""

    start: RunConfig
    repeats: int = 2
    """Runs of each side a verification starts with."""
    max_repeats: int | None = None
    """Runs of each side it may grow to while its verdict is open; None: DEFAULT_MAX_REPEATS (or
    `repeats`, when more)."""
    budget_gib: float | None = None
    time_budget_s: float | None = None
    allow_model_changes: bool = False
    max_rounds: int = 8
    """Single-change rounds at most (the combination round comes on top)."""
    probe_budget_s: float = 120.0
    """Seconds of what-if probes a round may spend ranking its candidates by measured gain (0: by the
    modelled ranges); probes are cached, so a round repeats none an earlier one measured."""
    source: Mapping[str, Any] | None = None
    """How the starting config was given (preset, config file, overrides), for the record."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats: got {self.repeats}; allowed: an integer > 0")
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise ValueError(f"max_repeats: got {self.max_repeats}; allowed: at least repeats ({self.repeats})")

    @property
    def most(self) -> int:
        return self.max_repeats if self.max_repeats is not None else max(DEFAULT_MAX_REPEATS, self.repeats)


def _key(settings: Mapping[str, Any]) -> str:
    """One text per change, whatever names its fields were given by (a shorthand or the full path)."""
    return settings_text(records.canonical(settings))


def expected_gain_pct(rec: Mapping[str, Any]) -> float | None:
    """The middle of a recommendation's expected tokens/s range (%), None when it has none."""
    tps: Any = (rec.get("expected") or {}).get("tokens_per_s")
    try:
        gain = (float(tps["low"]) + float(tps["high"])) / 2
    except (KeyError, TypeError, ValueError):
        return None
    return gain if math.isfinite(gain) else None


def order(recommendations: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The order tune tries recommendations in. Remedies judged by something else than tokens/s (peak
    memory, stability) first, in the advice's order: they remove a limit (a config over the memory
    budget is refused whatever its speed). Then the speed changes by expected tokens/s gain, the
    middle of its range, largest first; at an equal gain (to the whole percent) one whose expectation
    was measured (`expected.source`) before one that was modelled; then the advice's order."""
    def key(item: tuple[int, Mapping[str, Any]]) -> tuple[int, float, int, int]:
        index, rec = item
        if rec.get("judged_by") != "tokens_per_s":
            return 0, 0.0, 0, index
        gain = expected_gain_pct(rec)
        measured = (rec.get("expected") or {}).get("source") == "measured"
        return 1, -round(gain) if gain is not None else math.inf, 0 if measured else 1, index

    return [rec for _, rec in sorted(enumerate(recommendations), key=key)]


def combination(rounds: Sequence[Mapping[str, Any]], adopted: Sequence[Mapping[str, Any]]
                ) -> dict[str, Any] | None:
    """What the last round verifies together, or None.

    Promising: the changes whose verification stayed inconclusive with a positive measured tokens/s
    change, largest first, each left out when it sets a key differently from the adopted changes or
    from a promising one before it. With at least two changes between the adopted and the promising
    ones: the promising ones merged, `against` the adopted config ("adopted"); with none promising
    and two or more adopted: the adopted ones merged, against the starting config ("start")."""
    current = {k: v for s in adopted for k, v in records.canonical(s).items()}
    promising = [e for e in rounds if e.get("kind", "change") == "change"
                 and (e.get("result") or {}).get("verdict") == "inconclusive"
                 and ((e["result"].get("measured") or {}).get("metric") == "tokens_per_s")
                 and float(e["result"]["measured"].get("change_pct") or 0) > 0]
    promising.sort(key=lambda e: -float(e["result"]["measured"]["change_pct"]))
    merged: dict[str, Any] = {}
    combined: list[dict[str, Any]] = []
    for entry in promising:
        change = records.canonical(entry["tried"])
        if any(current.get(k, v) != v or merged.get(k, v) != v for k, v in change.items()):
            continue
        merged.update(change)
        combined.append(dict(entry["tried"]))
    if combined and len(combined) + len(adopted) >= 2:
        return {"set": merged, "combined": combined, "against": "adopted"}
    if not combined and len(adopted) >= 2:
        return {"set": current, "combined": [dict(s) for s in adopted], "against": "start"}
    return None


def _peak_gib(runs: Sequence[RunData]) -> float | None:
    stored = [r.stored_summary or {} for r in runs]
    peaks = [float(s["peak_memory_bytes"]) / 2**30 for s in stored if s.get("peak_memory_bytes")]
    return max(peaks) if peaks else None


def run_figures(run: RunData) -> dict[str, Any]:
    """The run's throughput and peak memory, as the tuned record states them."""
    return {"run": run.id, "tokens_per_s": summary_of(run).get("tokens_per_s"), "peak_memory_gib": _peak_gib([run])}


def _decide(result: Mapping[str, Any], cand: Sequence[RunData], budget: float | None) -> tuple[bool, str]:
    if result["verdict"] != CONFIRMED:
        return False, f"{result['verdict']}: {result['reason']}"
    peak = _peak_gib(cand)
    if budget is not None and peak is not None and peak > budget:
        return False, f"confirmed, but its peak memory {peak:.2f} GiB exceeds the {budget:g} GiB budget"
    return True, f"confirmed: {result['reason']}"


@dataclass
class _Round:
    """One verified round: its record entry, its runs by trial, and the changed config (None: not run)."""

    entry: dict[str, Any]
    runs: dict[str, list[RunData]]
    cfg: RunConfig | None
    label: str


class Recorded:
    """A tuning's record on disk (`<runs_dir>/tunes/<id>/tune.json`), rewritten after every round, so Ctrl-C
    keeps it; `run` runs the rounds (`_rounds`), and records why they stopped early: Ctrl-C, or one of
    `FAILS` (the tuning cannot go on: its message is the record's `stopped`)."""

    FAILS: tuple[type[Exception], ...] = ()
    dir: Path
    record: dict[str, Any]
    started: float
    time_budget_s: float | None
    ran_s: list[float]
    """Seconds from the start to the end of each run the tuning made."""

    def _open(self, runs_dir: Path, name: str, spec: Mapping[str, Any]) -> None:
        self.started, self.ran_s = time.perf_counter(), []
        self.dir = records.create(runs_dir, "tune", name, {"status": "running", "spec": dict(spec), "rounds": [],
                                                           "adopted": []})
        self.record = records.read(self.dir, "tune")

    def _save(self, **fields: Any) -> None:
        self.record.update(fields, elapsed_s=round(time.perf_counter() - self.started, 1))
        records.write(self.dir, "tune", self.record)

    def _ran(self) -> None:
        """One more run done."""
        self.ran_s.append(time.perf_counter() - self.started)

    def _over_time(self, runs: int) -> bool:
        """Whether `runs` more runs, each as long as the runs so far on average, would overrun the time budget."""
        if self.time_budget_s is None or not self.ran_s:
            return False
        expected = runs * self.ran_s[-1] / len(self.ran_s)
        return time.perf_counter() - self.started + expected > self.time_budget_s

    def run(self) -> dict[str, Any]:
        """Tune until nothing left confirms or a budget is spent; returns the record."""
        try:
            return self._rounds()
        except KeyboardInterrupt:
            self._save(status="interrupted", stopped="interrupted (Ctrl-C): the rounds done are kept")
            raise
        except self.FAILS as exc:
            self._save(status="failed", stopped=str(exc))
            raise

    def _rounds(self) -> dict[str, Any]:
        raise NotImplementedError


class Tuner(Recorded):
    """One tuning session of a profile-run config."""

    def __init__(self, spec: TuneSpec, *, runs_dir: Path, progress: bool = True,
                 on_round: Callable[[Mapping[str, Any]], None] | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.spec, self.runs_dir, self.progress, self.on_round = spec, runs_dir, progress, on_round
        self.say = say
        """Where a line of progress besides the runs' goes (the probes'); None: nowhere."""
        self.time_budget_s = spec.time_budget_s
        self._open(runs_dir, spec.start.name, {
            **(spec.source or {}), "repeats": spec.repeats, "max_repeats": spec.most,
            "memory_budget_gib": spec.budget_gib, "time_budget_s": spec.time_budget_s,
            "allow_model_changes": spec.allow_model_changes, "steps": spec.start.train.steps,
            "probe_budget_s": spec.probe_budget_s})

    def _cells(self, cells: Sequence[Cell]) -> list[tuple[Cell, Path]]:
        done = []
        for cell, run_dir in run_cells(cells, runs_dir=self.runs_dir, progress=self.progress):
            done.append((cell, run_dir))
            self._ran()
        return done

    def _verify(self, round_no: int, run: RunData, rec: Mapping[str, Any], head: dict[str, Any]) -> _Round:
        """Verify `rec` against a fresh run of `run`'s config, adding repeats while the verdict is open."""
        t0 = time.perf_counter()
        spec = self.spec
        trials = trials_for(run, [rec], repeats=spec.repeats, steps=spec.start.train.steps,
                            name=f"{spec.start.name}.r{round_no}")
        entry = {"round": round_no, **head, "tried": dict(rec["set"]), "for": rec["for"], "expected": rec["expected"]}
        if len(trials.trials) < 2:  # the catalog rejects the changed config: nothing to run
            why = trials.refused[0]["reason"]
            result = {"switch": rec.get("switch"), "set": dict(rec["set"]), "verdict": "refuted", "reason": why,
                      "runs": [], "repeats": 0, "stopped": "not_measured"}
            return _Round({**entry, "result": result, "repeats": 0, "decision": "refused", "why": why,
                           "round_s": 0.0}, {}, None, "")

        def execute(cells: Sequence[Cell]) -> list[tuple[Cell, Path]]:
            return self._cells([Cell(c.label, c.cfg, nproc=c.nproc, links={**c.links, "tune": {
                "id": self.dir.name, "round": round_no}}) for c in cells])

        seq = Sequential(trials, most=spec.most, budget_gib=spec.budget_gib)
        result = seq.run(execute, may_add=lambda cells: not self._over_time(cells))["results"][0]
        runs = seq.runs()
        cand = trials.trials[-1]
        take, why = _decide(result, runs.get(cand.label, []), spec.budget_gib)
        entry.update(result=result, repeats=result["repeats"], decision="adopted" if take else "refused", why=why,
                     round_s=round(time.perf_counter() - t0, 1))
        return _Round(entry, runs, cand.cfg, cand.label)

    def _record_round(self, entry: Mapping[str, Any], adopted: Sequence[Mapping[str, Any]]) -> None:
        self.record["rounds"].append(entry)
        self._save(adopted=list(adopted))
        if self.on_round:
            self.on_round(entry)

    def _rounds(self) -> dict[str, Any]:
        spec, current = self.spec, self.spec.start
        start_cell = Cell("start", current, links={"tune": {"id": self.dir.name, "round": 0, "trial": "start"}})
        newest = first = load_run(self._cells([start_cell])[0][1])
        self._save(start_run=newest.id)
        tried: set[str] = set()
        adopted: list[dict[str, Any]] = []
        stopped, out_of_time = f"{spec.max_rounds} rounds done", False
        for round_no in range(1, spec.max_rounds + 1):
            # nothing holding the run back: try what makes compute faster
            probes = ProbeBudget(total_s=spec.probe_budget_s) if spec.probe_budget_s > 0 else None
            advice = advise(newest, allow_model_changes=spec.allow_model_changes, explore_when_clear=True,
                            probes=probes, progress=self.say, to_verify=True)
            todo = order([r for r in advice["recommendations"] if _key(r["set"]) not in tried])
            diagnosis = advice["verdict"] + ("; trying what makes compute faster" if advice.get("explored") else "")
            if not todo:
                stopped = f"nothing left to try: {advice['verdict']}"
                break
            if self._over_time(2 * spec.repeats):
                stopped, out_of_time = "the time budget would be exceeded by another round", True
                break
            rec = todo[0]
            tried.add(_key(rec["set"]))
            done = self._verify(round_no, newest, rec, {
                "kind": "change", "diagnosed_run": newest.id, "diagnosis": diagnosis,
                "bottlenecks": [b["kind"] for b in advice["bottlenecks"]]})
            # the next diagnosis reads the first repeat: the one traced, with the operators its rules need
            if done.entry["decision"] == "adopted" and done.cfg is not None:
                current = replace(done.cfg, name=spec.start.name)  # under the name the tuning started with
                adopted.append(dict(rec["set"]))
                newest = done.runs[done.label][0]
            elif done.runs.get("baseline"):
                newest = done.runs["baseline"][0]
            self._record_round(done.entry, adopted)
        together = combination(self.record["rounds"], adopted)
        if together is not None and not out_of_time:
            if self._over_time(2 * spec.repeats):
                stopped += "; the changes together were not verified: the time budget would be exceeded"
            else:
                current, newest = self._together(len(self.record["rounds"]) + 1, together, current, newest, first,
                                                 adopted)
        tuned = {"settings": {k: v for s in adopted for k, v in records.canonical(s).items()},
                 "config": current.to_dict(), "start": run_figures(first), "end": run_figures(newest),
                 "tuning_s": round(time.perf_counter() - self.started, 1), "runs": len(self.ran_s)}
        self._save(status="completed", stopped=stopped, tuned=tuned)
        return self.record

    def _together(self, round_no: int, together: Mapping[str, Any], current: RunConfig, newest: RunData,
                  first: RunData, adopted: list[dict[str, Any]]) -> tuple[RunConfig, RunData]:
        """The combination round; the current config and its newest run after it."""
        against_start = together["against"] == "start"
        texts = ", ".join(settings_text(s) for s in together["combined"])
        head = {"kind": "combination", "against": together["against"], "combined": together["combined"],
                "diagnosed_run": (first if against_start else newest).id,
                "diagnosis": (f"the adopted changes together against the starting config: {texts}" if against_start
                              else f"the changes that stayed inconclusive with a measured gain, together on top "
                                   f"of the adopted config: {texts}"), "bottlenecks": []}
        combined = [_key(s) for s in together["combined"]]
        results = [e["result"] for e in self.record["rounds"]
                   if e.get("kind") == "change" and _key(e["tried"]) in combined and e["result"].get("risk")]
        rec = {"switch": COMBINED, "set": together["set"], "judged_by": "tokens_per_s", "for": "all",
               "expected": None, "risk": worst_risk(results)}
        done = self._verify(round_no, first if against_start else newest, rec, head)
        if against_start:  # the adopted config stays: each change was confirmed on top of those before it
            verdict = done.entry["result"]["verdict"]
            done.entry.update(decision="kept", why=(done.entry["why"] if verdict == CONFIRMED else
                              f"not confirmed together ({done.entry['why']}); the changes stay adopted: each was "
                              "confirmed on top of those before it"))
            if done.runs.get(done.label):
                newest = done.runs[done.label][0]
        elif done.entry["decision"] == "adopted" and done.cfg is not None:
            current = replace(done.cfg, name=self.spec.start.name)
            adopted.append(dict(together["set"]))
            newest = done.runs[done.label][0]
        elif done.runs.get("baseline"):
            newest = done.runs["baseline"][0]
        self._record_round(done.entry, adopted)
        return current, newest
