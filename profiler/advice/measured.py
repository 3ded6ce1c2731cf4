"""Expected gains measured, not modelled: each recommendation's change probed on the run's own model,
shapes and machine (profiler.advice.probes), its range recomputed from what the probe measured.

A probe gives, per round, each side's time per token in every phase. A phase's ratio is the changed
side's time over the baseline's; the expected step is Amdahl's law over the *run's* measured breakdown,
new = sum of share_p x ratio_p, so a run whose time goes elsewhere (data, checkpoints) gains what its own
breakdown allows. A phase the probe's baseline spends under MIN_PHASE of its step in keeps its share as
it is (its ratio would be noise), and what one process cannot time (exposed communication) keeps the
catalog's model, said in `modelled_parts`. The interval is a bootstrap over the probe's rounds (the
probe's own noise), widened by what the probe cannot see: how much a fresh run of one config moves from
run to run on this machine (profiler.advice.spread, learned from every verification), so the range is
one for the user's next run against the run advised. Memory: the change in bytes held across a step over
the run's peak, widened the same way.

Every expected range says where it comes from: `source` is "measured" (with the probe's rounds, cost
and one-off cost) or "modelled" (the catalog's prior, scaled by the run's figures), and why a change
was not probed.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optimizers import REGISTRY, Candidate
from optimizers.vocabulary import Bottleneck
from profiler.advice.diagnose import v
from profiler.advice.probes import RELATIVE_WIDTH, Probe, ProbeError, Prober, cached, keep
from profiler.advice.recommend import SPEED_ASSUMED, effect_fraction, score_of, severities
from profiler.advice.spread import Spread, run_to_run
from profiler.analysis import RunData
from profiler.analysis.figures import Figures
from profiler.instruments.machine import has_cuda
from profiler.metrics import PHASE_NAMES, lookup
from profiler.settings import settings_text

CONFIDENCE = 0.90
Z = 1.645
"""The normal quantile of a two-sided CONFIDENCE interval."""
RESAMPLES = 400
MIN_PHASE = 0.02
"""A phase under this share of the probe baseline's step keeps its ratio at 1."""
MIN_GAIN = 2.0
"""% tokens/s: an explored change (no rule fired) is recommended only when its measured interval's low
end clears this."""
MIN_PROBE_S = 3.0
"""Budget left below which no new probe starts (it could not finish its minimum rounds)."""
DEAREST = ("switches.compile.",)
"""Changes probed last: compiling alone can take longer than every other probe together."""
ONE_PROCESS = ("switches.parallel.", "switches.ddp.")
"""Changes of layout or communication: a probe in one process cannot measure them."""


@dataclass(frozen=True)
class ProbeBudget:
    """How much probing a command may do: seconds in all, and per change."""

    total_s: float = 120.0
    per_change_s: float = 15.0
    dearest: bool = True
    """Probe the DEAREST changes too. A run's own end does not: their one-off cost (compile time) is no
    part of a budget a probe can stop at, so they are left to `glmperf recommend`."""


def _shares(figures: Figures) -> dict[str, float]:
    """The run's breakdown as fractions of its step (0 for a phase not measured)."""
    return {p: (0.0 if math.isnan(s := v(figures, f"share.{p}")) else s / 100) for p in PHASE_NAMES}


def _candidate(rec: Mapping[str, Any]) -> Candidate | None:
    """The catalog's candidate a recommendation came from (its modelled effects), by switch and keys."""
    opt = next((o for o in REGISTRY if o.name == rec["switch"]), None)
    keys = set(rec["set"])
    return next((c for c in opt.candidates if set(c.set) == keys), None) if opt is not None else None


def _gain(ratios: Mapping[str, float], shares: Mapping[str, float]) -> float:
    """% tokens/s from per-phase time ratios over the run's breakdown (Amdahl)."""
    new = sum(shares[p] * ratios.get(p, 1.0) for p in shares)
    total = sum(shares.values())
    return 100 * (total / new - 1) if new > 0 else math.nan


def _ratios(probe: Probe, rounds: Sequence[int], timed: Sequence[str]) -> dict[str, float]:
    """Each timed phase's changed-over-baseline time: the median of the rounds' ratios (a stray slow step
    moves it little), or, for a phase some rounds skip (a checkpoint every k steps), the ratio of sums."""
    out = {}
    for p in timed:
        base = [probe.base[i][p] for i in rounds]
        cand = [probe.cand[i][p] for i in rounds]
        if all(b > 0 for b in base):
            out[p] = statistics.median(c / b for b, c in zip(base, cand, strict=True))
        else:
            out[p] = sum(cand) / sum(base) if sum(base) > 0 else 1.0
    return out


def gain_from_probe(probe: Probe, figures: Figures, *, comm_ratio: tuple[float, float] = (1.0, 1.0),
                    contended: float = 0.0, spread: float = 0.0) -> dict[str, float]:
    """The expected tokens/s change: {"point", "low", "high"} in %, the interval a bootstrap over rounds.

    `comm_ratio`: the (best, worst) ratio of the run's exposed communication as the catalog models it;
    its spread widens the interval. `contended`: the fraction of the run's other phases that its ranks
    spent beyond what one process spends on them (`contention`); the change may leave that time as it
    is or shrink it as much as the communication at best, and the range spans both. `spread`: one
    fresh run's sigma of log(tokens/s) on this machine (profiler.advice.spread); the interval becomes
    one for the user's next run against this one."""
    shares = _shares(figures)
    busy = {p: s for p, s in shares.items() if p != "comm"}
    shares = {**{p: s * (1 - contended) for p, s in busy.items()}, "comm": shares["comm"],
              "contention": contended * sum(busy.values())}
    base_step = sum(sum(r.values()) for r in probe.base)
    timed = [p for p in PHASE_NAMES if p != "comm" and sum(r[p] for r in probe.base) >= MIN_PHASE * base_step]
    everything = list(range(probe.rounds))

    def gain(rounds: Sequence[int], comm: float, contention: float) -> float:
        return _gain({**_ratios(probe, rounds, timed), "comm": comm, "contention": contention}, shares)

    middle = statistics.mean(comm_ratio)
    point = gain(everything, middle, (1 + comm_ratio[0]) / 2)
    rng = random.Random(0)
    draws = sorted(gain([rng.randrange(probe.rounds) for _ in everything], middle, (1 + comm_ratio[0]) / 2)
                   for _ in range(RESAMPLES))
    tail = (1 - CONFIDENCE) / 2
    low, high = _widened(point, draws[int(tail * RESAMPLES)], draws[int((1 - tail) * RESAMPLES) - 1], spread)
    return {"point": point, "low": low - (point - gain(everything, comm_ratio[1], 1.0)),
            "high": high + (gain(everything, comm_ratio[0], comm_ratio[0]) - point)}


def contention(probe: Probe, figures: Figures, rank_tokens: float) -> float:
    """The fraction of a multi-rank run's phases other than communication that its ranks spent beyond
    what the probe's one process spends on them per token (0 when they spent no more): time the
    ranks lost to what they share with communication (cores, memory bandwidth, waits for each other),
    which one process cannot see."""
    ms = [v(figures, f"phase_ms.{p}") for p in PHASE_NAMES if p != "comm"]
    ran = sum(m for m in ms if math.isfinite(m)) / 1e3 / rank_tokens
    one = statistics.median(sum(t for p, t in r.items() if p != "comm") for r in probe.base)
    return min(0.9, max(0.0, 1 - one / ran)) if ran > 0 else 0.0


RUNS_IN_A_PREDICTION = 3
"""The user's next run, the run advised, and the probe's own process (two probes of one change in two
processes differ about as much as two runs do): each carries one run's spread."""


def run_to_run_width(spread: float) -> float:
    """Half the 90% width, in log(value), that RUNS_IN_A_PREDICTION runs' spread adds on a machine whose
    fresh runs spread by `spread` (sigma of log(value))."""
    return Z * math.sqrt(RUNS_IN_A_PREDICTION) * spread


def _widened(point: float, low: float, high: float, spread: float) -> tuple[float, float]:
    """A gain interval (in %) widened, on the log scale of the step time, by the run-to-run spread."""
    if spread <= 0:
        return low, high
    extra = run_to_run_width(spread)
    centre = _log_step(point)
    up, down = _log_step(low) - centre, centre - _log_step(high)
    return (100 * (math.exp(-(centre + math.hypot(up, extra))) - 1),
            100 * (math.exp(-(centre - math.hypot(down, extra))) - 1))


def _log_step(gain: float) -> float:
    """log of the step time's ratio that a tokens/s gain (in %) means."""
    return -math.log1p(gain / 100)


def _comm(candidate: Candidate | None, figures: Figures) -> tuple[tuple[float, float], bool]:
    """The modelled ratio range of the run's exposed communication under the change, and whether the
    change touches it at all."""
    effects = [e for e in (candidate.effects if candidate else ()) if e.target == "comm"]
    if not effects or not v(figures, "share.comm") > 0:
        return (1.0, 1.0), False
    low, high = effect_fraction(effects[0], figures)
    sign = -1 if effects[0].change == "shrinks" else 1
    return (1 + sign * high, 1 + sign * low) if sign < 0 else (1 + sign * low, 1 + sign * high), True


def expected_from_probe(rec: Mapping[str, Any], probe: Probe, figures: Figures, *, was_cached: bool,
                        spreads: Mapping[str, Spread] | None = None, rank_tokens: float = 0.0
                        ) -> dict[str, Any]:
    """A recommendation's `expected` from its probe: the modelled one's keys, `source` "measured", the
    probe's own figures, and `modelled_parts` for what stays modelled (communication; memory a probe of
    speed did not count). `spreads`: this machine's run-to-run spread by metric (profiler.advice.spread),
    which widens each range to one for the user's next run; `run_to_run` says what was used.
    `rank_tokens`: tokens one rank's step takes in the run, to compare its phases with the probe's."""
    modelled = rec["expected"]
    spreads = spreads or {}
    comm, modelled_comm = _comm(_candidate(rec), figures)
    contended = contention(probe, figures, rank_tokens) if modelled_comm and rank_tokens > 0 else 0.0
    speed, held = spreads.get("tokens_per_s"), spreads.get("peak_memory")
    tps = gain_from_probe(probe, figures, comm_ratio=comm, contended=contended, spread=speed.sigma if speed else 0.0)
    out: dict[str, Any] = {"tokens_per_s": {"low": tps["low"], "high": tps["high"], "point": tps["point"],
                                            "unit": "%", "confidence": CONFIDENCE}}
    parts = ["comm"] if modelled_comm else []
    peak = v(figures, "peak_memory")
    basis = (f"probe: {probe.rounds} rounds side by side on {probe.machine} ({probe.threads} threads), step time "
             f"per token x{statistics.median(probe.step_ratios()):.2f}, through this run's breakdown")
    if probe.one_off_s >= 1:
        basis += f"; a one-off {probe.one_off_s:.0f} s before the first step"
    if probe.memory and peak > 0 and math.isfinite(probe.memory["base"]):
        change = 100 * (probe.memory["cand"] - probe.memory["base"]) / (peak * 2**30)
        half = 100 * run_to_run_width(held.sigma) if held else 0.0
        out["peak_memory"] = {"low": change - half, "high": change + half, "unit": "%", "from_gib": peak,
                              "to_gib": [peak * (1 + (change - half) / 100), peak * (1 + (change + half) / 100)]}
        basis += f"; held memory {change:+.1f}% of the run's peak ({probe.memory_kind})"
    elif "peak_memory" in modelled:
        out["peak_memory"] = modelled["peak_memory"]
        parts.append("peak_memory")
    if modelled_comm:
        basis += "; exposed communication modelled (one process cannot measure it)"
    if contended >= 0.05:
        basis += (f"; the ranks' other phases took x{1 / (1 - contended):.2f} the time one process takes: "
                  "that excess may stay or shrink with the communication")
    used = {m: s for m, s in spreads.items() if m == "tokens_per_s" or "peak_memory" not in parts}
    basis += _spread_text(used)
    out["run_to_run"] = {m: s.as_json() for m, s in used.items()}
    out.update(basis=basis, source="measured", modelled_parts=parts,
               probe={"rounds": probe.rounds, "cost_s": round(probe.cost_s, 1), "one_off_s": round(probe.one_off_s, 1),
                      "cached": was_cached, "stopped": probe.stopped, "machine": probe.machine,
                      "threads": probe.threads, "measured": probe.measured})
    return out


def _spread_text(spreads: Mapping[str, Spread]) -> str:
    """How the ranges allow for a fresh run's spread on this machine, for the basis."""
    if not spreads:
        return "; the range is the probe's alone"
    return "; widened for the next run against this one (this machine's run-to-run spread: " + ", ".join(
        f"{m} {s.text()}" for m, s in spreads.items()) + ")"


def _rank_tokens(run: RunData) -> float:
    """Tokens one rank's optimizer step takes (its micro-batches together); 0 where the config does not say."""
    sizes = [lookup(run.config, k) for k in ("train.batch_size", "data.seq_len")]
    accumulation = lookup(run.config, "switches.grad_accumulation.steps") or 1
    return float(math.prod(sizes) * accumulation) if all(isinstance(n, int) for n in sizes) else 0.0


def why_not_probed(rec: Mapping[str, Any], run: RunData) -> str | None:
    """Why a recommendation's change cannot be probed on this machine, or None."""
    if rec.get("judged_by") == "stability":
        return "judged by the stability events it prevents, not by a speed a probe can measure"
    if any(k.startswith(ONE_PROCESS) for k in rec["set"]):
        return "a change of layout or communication: one process cannot measure it"
    layout = {d: lookup(run.config, f"switches.parallel.{d}") or 1 for d in ("fsdp", "tp", "pp")}
    if any(int(ways) > 1 for ways in layout.values()):
        return f"the run's layout ({', '.join(f'{d}={w}' for d, w in layout.items())}) needs its ranks"
    if run.on_cuda and not has_cuda():
        return "the run ran on a GPU and this machine has none"
    return None


@dataclass(frozen=True)
class Outcome:
    """What asking for one change's probe gave: its probe, or why none (`why`)."""

    probe: Probe | None
    state: str = "measured"
    """"measured" now, "cached", "left" (not now: the budget was spent, or compile at a run's end; a later
    `glmperf recommend` probes it), "failed" (a trainer raised), "refused" (it cannot be probed here)."""
    why: str | None = None

    def as_json(self, change: Mapping[str, Any]) -> dict[str, Any]:
        """The change and what became of it, for the advice's `probes.changes`."""
        if self.probe is None:
            return {"set": dict(change), "state": self.state, "why": self.why}
        return {"set": dict(change), "state": self.state, "rounds": self.probe.rounds,
                "cost_s": round(self.probe.cost_s, 1)}


def _probe_one(prober: Prober, rec: Mapping[str, Any], budget: ProbeBudget, spent: float,
               progress: Callable[[str], None] | None, width: float) -> Outcome:
    key = prober.key(rec["set"])
    found = cached(key)
    if found is not None:
        return Outcome(found, "cached")
    if not budget.dearest and _dearest(rec):
        return Outcome(None, "left", "its compile time is no part of a budget a probe can stop at: "
                       "`glmperf recommend` probes it")
    budget_s = min(budget.per_change_s, budget.total_s - spent)
    if budget_s < MIN_PROBE_S:
        return Outcome(None, "left", "the probe budget was spent (--probe-budget)")
    if progress is not None:
        progress(f"probing {settings_text(rec['set'])} (up to {budget_s:.0f} s)")
    try:
        found = prober.measure(rec["set"], budget_s=budget_s, memory=rec["judged_by"] == "peak_memory", width=width)
    except ProbeError as exc:
        return Outcome(None, "refused", str(exc))
    except Exception as exc:  # the change failed in a trainer: the advice stands, modelled
        return Outcome(None, "failed", f"the probe failed: {type(exc).__name__}: {exc}")
    keep(key, found)
    return Outcome(found)


def _dearest(rec: Mapping[str, Any]) -> bool:
    return any(k.startswith(DEAREST) for k in rec["set"])


def _refusal(rec: Mapping[str, Any], explored: bool, to_verify: bool) -> str | None:
    """Why a probed (or not probed) recommendation is dropped after all, or None. An explored change needs
    its measured interval's low end to clear MIN_GAIN, or only its point when a verification follows."""
    exp = rec["expected"]
    if exp["source"] == "modelled":
        if explored:
            return f"no rule fired and no probe measured it ({exp.get('not_probed')})"
        return None if rec["score"] > 0 else f"no expected gain on this run ({exp['basis']})"
    if rec["judged_by"] != "tokens_per_s":
        return None
    tps = exp["tokens_per_s"]
    floor = tps["low"] if explored and not to_verify else tps["point"]
    if floor < (MIN_GAIN if explored else 0.0):
        return (f"measured on this machine: tokens/s {tps['point']:+.1f}% [{tps['low']:+.1f}%, {tps['high']:+.1f}%] "
                f"({exp['basis']})")
    return None


def probe_advice(run: RunData, advice: Mapping[str, Any], figures: Figures, budget: ProbeBudget, *,
                 progress: Callable[[str], None] | None = None, to_verify: bool = False) -> dict[str, Any]:
    """`advice` with each recommendation's expected range measured where it can be, re-ranked by it.

    Recommendations are probed best first (by their modelled score) until the budget is spent. A change
    a probe measured slower is dropped to `excluded` with its figures; an explored advice (no rule fired)
    keeps only the changes whose measured interval clears MIN_GAIN (`to_verify`: whose point does, since a
    verification of each follows, as in `glmperf tune`). `probes` says what probing cost:
    `changes`, each change a probe could measure and what became of it (Outcome.as_json), and
    `at_run_end`, what profile-run measured at the run's end (run.json `end_probes`)."""
    explored = bool(advice.get("explored"))
    severity = severities(SPEED_ASSUMED if explored else advice)
    recs, excluded, changes = [], list(advice["excluded"]), []
    spent, measured, reused = 0.0, 0, 0
    threads = int(run.rank(0).get("torch_threads") or 0) or None
    spreads = {m: run_to_run(m, run.device) for m in ("tokens_per_s", "peak_memory")}
    width = max(RELATIVE_WIDTH, run_to_run_width(spreads["tokens_per_s"].sigma))
    with Prober(run.config, device=run.device, threads=threads) as prober:
        order = sorted(advice["recommendations"], key=_dearest)
        for original in order:
            rec = {**original, "expected": {**original["expected"], "source": "modelled"}}
            reason = why_not_probed(rec, run)
            found = None
            if reason is None:
                outcome = _probe_one(prober, rec, budget, spent, progress, width)
                found, was_cached, reason = outcome.probe, outcome.state == "cached", outcome.why
                changes.append(outcome.as_json(rec["set"]))
            if found is None:
                rec["expected"]["not_probed"] = reason
            else:
                reused += was_cached
                spent, measured = spent + (0.0 if was_cached else found.cost_s), measured + (not was_cached)
                rec["expected"] = expected_from_probe(rec, found, figures, was_cached=was_cached, spreads=spreads,
                                                      rank_tokens=_rank_tokens(run))
                kinds = [Bottleneck[k.upper()] for k in rec["addresses"]]
                rec["score"] = score_of(kinds, severity, rec["expected"])[0]
            refused = _refusal(rec, explored, to_verify)
            if refused:
                excluded.append({"switch": rec["switch"], "set": rec["set"], "reason": refused})
                continue
            if explored:
                rec["notes"] = [*rec["notes"], "no rule fired on this run: a probe measured this gain on this machine"]
            recs.append(rec)
    recs.sort(key=lambda r: r["score"], reverse=True)
    probes = {"budget_s": budget.total_s, "spent_s": round(spent, 1), "measured": measured, "cached": reused,
              "changes": changes}
    if "end_probes" in run.record:  # what profile-run measured at the run's end, in its own process
        probes["at_run_end"] = run.record["end_probes"]
    return {**advice, "recommendations": recs, "excluded": excluded, "probes": probes}
