"""A switch's effects and candidate changes, machine-readable, so a recommender can compute a gain.

An `Effect` says which part of a measured step a change shrinks or grows, and by what fraction
*per token*; a `Candidate` is one concrete config change a recommender may propose, with its
effects, what it requires (`Capability`), and its risk. With a run's measured breakdown (time per
token in each phase, peak memory, communication bytes) and the device's measured figures (the
bf16/fp32 matmul speed ratio, the attention share), `Effect.fraction` turns an effect into a
range, and Amdahl's law turns the ranges into an expected step-time gain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optimizers.vocabulary import Capability, StepPhase

PHASES = tuple(p.value for p in StepPhase)
"""The phases of a step an effect can target: its time per token."""

METRICS = ("peak_memory", "comm_bytes")
"""Figures besides phase times an effect can target: peak memory (bytes), and the gradient bytes a
rank hands its all-reduces per token."""

SCALES_WITH = {
    "": "nothing: low..high is the fraction itself",
    "bf16_matmul_speedup": "the device's measured bf16/fp32 matmul speed ratio over the run's own dtype's (1 for "
                           "fp32), s: low..high is the matmul share of the target, and the fraction is that share "
                           "x (1 - 1/s)",
    "fp16_matmul_speedup": "as bf16_matmul_speedup, for fp16",
    "attention_share": "the attention operators' measured share a of the target: low..high is the fraction of "
                       "the attention time removed or added, and the fraction is a x that",
    "run_dtype_speedup": "the measured speedup s of the run's own low-precision dtype over fp32 at the run's "
                         "shapes (s < 1: slower): low..high is the matmul share of the target, and going back "
                         "to fp32 removes that share x (1 - s)",
    "comm_exposed.all_gather": "the share e of the step spent in all-gathers no computation overlaps: "
                               "low..high is the fraction of that time removed, so the target phase loses "
                               "e/share(target) x that",
    "comm_exposed.send_recv": "as comm_exposed.all_gather, for sends and receives (a pipeline stage's wait "
                              "for its neighbour: its bubble)",
}
"""Measured figures an effect's fraction may depend on, and how."""

CHANGES = ("shrinks", "grows")
RISKS = ("none", "numerics", "convergence", "changes_model")
"""none: same results; numerics: results differ in the low bits (or lossy compression); convergence:
the optimization itself changes (batch, schedule); changes_model: a different model (pruning,
sharing, linear attention)."""


@dataclass(frozen=True)
class Effect:
    """`target` (a phase or a metric) shrinks or grows by low..high of its value per token.

    Per token, so a change of the tokens per step (grad accumulation) is stated right: x4 the tokens
    per optimizer step removes 0.75 of the optimizer's time per token. A shrinking fraction is in
    [0, 1] (1: the target vanishes), a growing one >= 0 (0.4: 40% more). `basis` says where the range
    comes from: a row of benchmarks/results/switch_effects.md, or the reasoning.
    """

    target: str
    change: str
    low: float
    high: float
    scales_with: str = ""
    basis: str = ""

    def __post_init__(self) -> None:
        if self.target not in PHASES + METRICS:
            raise ValueError(f"effect target {self.target!r}; known: {', '.join(PHASES + METRICS)}")
        if self.change not in CHANGES:
            raise ValueError(f"effect change {self.change!r}; known: {', '.join(CHANGES)}")
        if self.scales_with not in SCALES_WITH:
            raise ValueError(f"effect scales_with {self.scales_with!r}; known: {', '.join(filter(None, SCALES_WITH))}")
        # a share (the matmul share) or a removed fraction is at most 1; an added fraction is unbounded
        cap = 1.0 if self.change == "shrinks" or self.scales_with.endswith("_speedup") else float("inf")
        if not 0.0 <= self.low <= self.high <= cap:
            raise ValueError(f"effect on {self.target}: range {self.low}..{self.high} must be ordered, "
                             f"within [0, {cap:g}]")

    def fraction(self, figures: Mapping[str, float]) -> tuple[float, float]:
        """The (low, high) fraction of the target removed or added, given the measured `figures`
        (those named by `scales_with`; see SCALES_WITH). KeyError when the figure is missing; a
        measured speedup below 1 (an emulated dtype) gives negative fractions: the target grows."""
        if not self.scales_with:
            return self.low, self.high
        figure = figures[self.scales_with]
        per_part = 1.0 - 1.0 / figure if self.scales_with.endswith("_speedup") else figure
        return self.low * per_part, self.high * per_part


def no_modelled_gain(basis: str) -> tuple[Effect, ...]:
    """A change's effects when no model predicts its gain (each 0..0 on forward and backward): only a probe
    on the run's own model can advise it (`Candidate.probe_only`). `basis` says why."""
    return tuple(Effect(phase, "shrinks", 0.0, 0.0, basis=basis) for phase in ("forward", "backward"))


@dataclass(frozen=True)
class Derived:
    """A value computed from the current values of other keys (`fn(*[current(k) for k in reads])`)."""

    reads: tuple[str, ...]
    fn: Callable[..., Any]


Value = Any
"""A config value, a callable of the key's current value (`lambda every: every * 4`), or a `Derived`."""


def _always(section: Any) -> bool:
    return True


@dataclass(frozen=True)
class Candidate:
    """One concrete change a recommender may propose for a switch, and what it is expected to do.

    `set` maps full dotted config keys (`switches.amp.dtype`, `train.batch_size`) to values or to
    callables of the current value; `applies(section)` says whether it makes sense from the switch's
    current section (bf16 from off, not from bf16). `requires` names capabilities the run must
    have; `risk` is one of RISKS.
    """

    set: Mapping[str, Value]
    effects: tuple[Effect, ...]
    requires: tuple[Capability, ...] = ()
    risk: str = "none"
    note: str = ""
    applies: Callable[[Any], bool] = field(default=_always, compare=False)

    def __post_init__(self) -> None:
        if self.risk not in RISKS:
            raise ValueError(f"candidate risk {self.risk!r}; known: {', '.join(RISKS)}")
        if not self.set:
            raise ValueError("a candidate sets at least one config key")

    @property
    def probe_only(self) -> bool:
        """It has effects and they model no gain (each 0..0): only a probe on the run's own model can advise
        it. (A candidate without effects is judged by what it prevents: a stability remedy.)"""
        return bool(self.effects) and all(e.low == e.high == 0.0 for e in self.effects)

    def resolve(self, current: Callable[[str], Any]) -> dict[str, Any]:
        """The concrete values to set, callables called with `current(key)`, the key's value now."""
        def one(key: str, value: Value) -> Any:
            if isinstance(value, Derived):
                return value.fn(*(current(k) for k in value.reads))
            return value(current(key)) if callable(value) else value

        return {key: one(key, value) for key, value in self.set.items()}
