"""Where the step's time goes: step time, each phase's share and milliseconds, throughput and MFU.

Figures: `step_ms` (median step, ms), `share.<phase>` (% of the step, the slowest rank's critical
path), `phase_ms.<phase>` (mean ms per step), `tokens_per_s`, `mfu` (%), `steps_counted`, and with
several ranks `straggler` (x: the slowest rank's median step over the median rank's) and
`slowest_rank`; with an imported trace's rank arriving last at its collectives
(summary.trace.collectives_across_ranks.straggler) `late_rank`, `late_calls`, `late_share` (% of them it
was last in) and `late_skew_ms` (median ms after the first rank).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData
from profiler.metrics import PHASES
from profiler.traces.collective_skew import straggler_calls


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    shares = summary.get("phase_share") or {}
    mean_ms = num((summary.get("step_time_s") or {}).get("mean")) * 1e3
    out: Figures = {
        "step_ms": Figure(num((summary.get("step_time_s") or {}).get("p50")) * 1e3, "ms", "summary.step_time_s.p50"),
        "tokens_per_s": Figure(num(summary.get("tokens_per_s")), "tokens/s", "summary.tokens_per_s"),
        "mfu": Figure(num(summary.get("mfu")) * 100, "%", "summary.mfu"),
        "steps_counted": Figure(num(summary.get("steps_counted")), "steps", "summary.steps_counted"),
    }
    straggler = summary.get("straggler")
    if straggler:
        out["straggler"] = Figure(num(straggler.get("slowest_over_median")), "x",
                                  "summary.straggler.slowest_over_median")
        out["slowest_rank"] = Figure(num(straggler.get("slowest_rank")), "rank", "summary.straggler.slowest_rank")
    late = ((summary.get("trace") or {}).get("collectives_across_ranks") or {}).get("straggler")
    if late:
        source = "summary.trace.collectives_across_ranks.straggler"
        out["late_rank"] = Figure(num(late.get("rank")), "rank", f"{source}.rank", label=straggler_calls(late))
        out["late_calls"] = Figure(num(late.get("calls")), "calls", f"{source}.calls")
        out["late_share"] = Figure(num(late.get("last_share")) * 100, "%", f"{source}.last_share")
        out["late_skew_ms"] = Figure(num(late.get("skew_ms")), "ms", f"{source}.skew_ms")
    for p in PHASES:
        share = num(shares.get(p.name))
        out[f"share.{p.name}"] = Figure(share * 100, "%", f"summary.phase_share.{p.name}")
        out[f"phase_ms.{p.name}"] = Figure(share * mean_ms, "ms", f"summary.phase_share.{p.name} x step_time_s.mean")
    return out
