"""Running a verification: `Sequential` adds repeats while a verdict is open; `run_verification` runs
a profile-run run's (`glmperf recommend RUN --verify`), profiler.experiments.rerun a command's.

Sequential testing (`Sequential`): a verification may start with few repeats and add one more
interleaved repeat of the baseline and each undecided candidate until the verdict is decided or
`most` repeats a side ran. Looking at the interval after every repeat and stopping at the first
decision would make a false confirmation likelier than the interval's confidence says (optional
stopping), so each look reads the interval at a stricter confidence: Bonferroni over the looks
that may come, 1 - (1 - CONFIDENCE) / looks (99% over 5 looks: 99.8% at each). By the union bound
the chance that any look's interval misses the true change stays within 1 - CONFIDENCE (as far as
compare's intervals hold their confidence), whatever the looks' dependence. With one look (`most`
equal to the starting repeats) that is compare's own 99%. The price: each look's interval is wider,
so a change that the first look would have decided at 99% may need a repeat more. A stability remedy's
verdict counts events and reads no interval (no confidence to correct): more repeats give it more runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from profiler.advice.spread import record_runs
from profiler.analysis import RunData, load_run
from profiler.experiments.verify import CONFIDENCE, Trial, Trials, judge, repeat_cells, store_verification, trials_for

Execute = Callable[[Sequence[Any]], Iterable[tuple[Any, Any]]]
"""Runs cells and yields each with its stored run directory (`batch.run_cells`, or a caller's wrapper of it)."""
MoreCells = Callable[..., tuple[Any, ...]]
"""The cells of one more repeat: `more(trials, repeat, labels, of=most)` (verify.repeat_cells, or the cells
of a caller that runs something else than configs: profiler.experiments.rerun)."""


@dataclass(frozen=True)
class Looks:
    """When a sequential verification looks at its intervals: after `start` repeats a side and after
    each one added, up to `most`; each look at `per_look` confidence (Bonferroni: see the module)."""

    start: int
    most: int
    confidence: float = CONFIDENCE
    """Over all the looks together."""

    def __post_init__(self) -> None:
        if self.start < 1 or self.most < self.start:
            raise ValueError(f"repeats: start {self.start} and most {self.most}; allowed: 1 <= start <= most")

    @property
    def count(self) -> int:
        return self.most - self.start + 1

    @property
    def per_look(self) -> float:
        return self.confidence if self.count == 1 else 1 - (1 - self.confidence) / self.count


class Sequential:
    """A verification that adds repeats while a verdict is open (the module's "Sequential testing").

    The plan's cells run first (`trials.repeats` a side); then, while a candidate is `inconclusive`
    with a measurement, one more repeat of the baseline and each such candidate runs, interleaved,
    until every candidate is decided, `most` repeats ran, or `may_add` refuses. A candidate's result
    is frozen at its last look: `repeats` (its runs) and `stopped` (one of STOPS) are added to it.

    Every verification's repeated runs are kept as this machine's run-to-run spread (profiler.advice.spread)
    unless `keep_spread` is False (a user's own command, whose runs vary with its own start-up and data).

        seq = Sequential(trials, most=6)
        verification = seq.run(lambda cells: run_cells(cells, runs_dir=...))
    """

    def __init__(self, trials: Trials, *, most: int | None = None, budget_gib: float | None = None,
                 more: MoreCells = repeat_cells, keep_spread: bool = True) -> None:
        self.trials, self.budget_gib, self.more, self.keep_spread = trials, budget_gib, more, keep_spread
        self.looks = Looks(trials.repeats, trials.repeats if most is None else most)
        self.done: list[tuple[Any, Any]] = []
        """Every (cell, run directory) so far, in the order they ran."""
        self.final: dict[str, dict[str, Any]] = {}
        """Each stopped candidate's result, by trial label."""
        self.interrupted = False
        self._open: dict[str, dict[str, Any]] = {}  # the last look's result of each candidate still open
        self._loaded: dict[str, RunData] = {}

    def run(self, execute: Execute, *, may_add: Callable[[int], bool] | None = None) -> dict[str, Any]:
        """Run to the end; the verification (`judge_trials`' shape). `may_add(n)`: whether n more cells
        may run (a time budget). Ctrl-C propagates; `verification()` then holds what was measured."""
        try:
            self._until_decided(execute, may_add)
        finally:
            if self.keep_spread:
                record_runs(self.runs().values())  # what the repeated runs showed of this machine's spread
        return self.verification()

    def _until_decided(self, execute: Execute, may_add: Callable[[int], bool] | None) -> None:
        cells, repeat = self.trials.cells, self.trials.repeats
        while True:
            try:
                for pair in execute(cells):
                    self.done.append(pair)
            except BaseException:  # Ctrl-C (batch.BatchInterrupted) or a crash: what ran is judged as it is
                self.interrupted = True
                raise
            self._look()
            if not self._open:
                break
            if repeat >= self.looks.most or (may_add is not None and not may_add(len(self._open) + 1)):
                why = "max_repeats" if repeat >= self.looks.most else "time_budget"
                self.final.update({label: {**result, "stopped": why} for label, result in self._open.items()})
                self._open = {}
                break
            cells = self.more(self.trials, repeat, {"baseline", *self._open}, of=self.looks.most)
            repeat += 1

    def runs(self) -> dict[str, list[RunData]]:
        """The stored runs so far, by trial (each loaded once)."""
        out: dict[str, list[RunData]] = {}
        for cell, run_dir in self.done:
            if str(run_dir) not in self._loaded:
                self._loaded[str(run_dir)] = load_run(run_dir)
            out.setdefault(cell.links["verifies"]["trial"], []).append(self._loaded[str(run_dir)])
        return out

    def _judge(self, trial: Trial, runs: Mapping[str, Sequence[RunData]]) -> dict[str, Any]:
        cand = runs.get(trial.label, [])
        result = judge(trial, runs.get("baseline", []), cand, budget_gib=self.budget_gib,
                       confidence=self.looks.per_look)
        return {**result, "repeats": len(cand)}

    def _look(self) -> None:
        """Judge the candidates not stopped yet; stop the decided ones."""
        runs = self.runs()
        self._open = {}
        for trial in self.trials.trials[1:]:
            if trial.label in self.final:
                continue
            result = self._judge(trial, runs)
            if result["verdict"] == "inconclusive" and "measured" in result:
                self._open[trial.label] = result
            else:  # confirmed, refuted, changes_numerics; or nothing to judge (its baseline failed)
                self.final[trial.label] = {**result, "stopped": "not_measured" if result["verdict"] == "inconclusive"
                                           else "decided"}

    def verification(self) -> dict[str, Any]:
        """What was measured so far, judged (a candidate not stopped as `interrupted`)."""
        runs = self.runs()
        base = runs.get("baseline", [])
        results = [self.final.get(t.label) or {**self._judge(t, runs), "stopped": "interrupted"}
                   for t in self.trials.trials[1:]]
        return {"repeats": max(self.trials.repeats, len(base)), "steps": self.trials.steps,
                "baseline_runs": [r.id for r in base], "results": results, "refused": list(self.trials.refused),
                "complete": not self.interrupted,
                "sequential": {"start": self.looks.start, "most": self.looks.most,
                               "confidence": self.looks.confidence, "per_look": self.looks.per_look}}


def run_verification(run: RunData, advice: Mapping[str, Any], *, top: int, repeats: int, steps: int,
                     runs_dir: Any, progress: bool = True, max_repeats: int | None = None) -> dict[str, Any]:
    """Run the plan of `top` recommendations and store the verdicts in the verified run, also when Ctrl-C
    stops it (what was measured is judged; `complete` says whether all of it ran). With `max_repeats`
    above `repeats`, an inconclusive candidate gets more repeats (`Sequential`)."""
    from profiler.experiments.batch import run_cells

    trials = trials_for(run, advice["recommendations"][:top], repeats=repeats, steps=steps)
    seq = Sequential(trials, most=max_repeats, budget_gib=run.memory_budget_gb or None)
    try:
        seq.run(lambda cells: run_cells(cells, runs_dir=runs_dir, progress=progress))
    finally:
        verification = seq.verification()
        store_verification(run.path, verification, advice)
    return verification
