"""Numbers and ranges worded for people, the same in the terminal, the reports and the dashboard.

Names and units come from the metric registry (profiler.metrics), so a table says what compare and
the reports say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from profiler.metrics import METRIC_BY_NAME, PHASES, Metric

HEADLINE = ("tokens_per_s", "step_time_p50", "step_time_p90", "step_time_p99")
TAIL = ("comm_bytes_per_step", "comm_overlap", "read_bytes_per_s", "straggler")


def fmt(value: Any, digits: int = 3) -> str:
    """A number for people (thousands separators, fixed digits); n/a for None and NaN."""
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _metric_row(m: Metric, summary: Mapping[str, Any], note: str = "") -> tuple[str, str]:
    unit = f" ({m.unit})" if m.unit else ""
    value = fmt(m.value(summary), m.digits)
    return f"{m.label}{unit}", f"{value}  [{note}]" if note and value != "n/a" else value


def summary_rows(record: Mapping[str, Any], summary: Mapping[str, Any], status: str) -> list[tuple[str, str]]:
    """The headline figures of a run, as (name with unit, value) pairs."""
    rows = [("status", status),
            ("steps counted", f"{summary.get('steps_counted', 0)} of {summary.get('steps_total', 0)}")]
    rows += [_metric_row(METRIC_BY_NAME[n], summary) for n in HEADLINE]
    shares = summary.get("phase_share") or {}
    rows += [_metric_row(METRIC_BY_NAME[f"{p.name}_share"], summary) for p in PHASES if p.name in shares]
    rows.append(_metric_row(METRIC_BY_NAME["peak_memory"], summary, str(summary.get("peak_memory_source", ""))))
    peak = summary.get("peak_flops")
    gflops = fmt(peak * 1e-9 if isinstance(peak, (int, float)) else None, 0)
    peak_note = (f"peak {gflops} GFLOP/s {summary.get('peak_dtype') or ''} x {summary.get('devices', 1)}, "
                 f"{summary.get('peak_flops_source', '')}")
    rows.append(_metric_row(METRIC_BY_NAME["mfu"], summary, peak_note))
    rows.append(("loss first -> last", f"{fmt(summary.get('loss_first'), 4)} -> {fmt(summary.get('loss_last'), 4)}"))
    rows += [_metric_row(METRIC_BY_NAME[n], summary) for n in TAIL
             if not math.isnan(METRIC_BY_NAME[n].value(summary))]
    if record.get("error"):
        rows.append(("error", str(record["error"])))
    return rows


def range_text(r: Mapping[str, Any]) -> str:
    if round(r["low"]) == round(r["high"]):
        return f"{r['low']:+.0f}%"
    return f"{r['low']:+.0f}% to {r['high']:+.0f}%"


def expected_text(rec: Mapping[str, Any]) -> str:
    """A recommendation's expected effect for people: throughput and memory ranges with their basis,
    or, for a remedy of instability, what it prevents."""
    exp = rec["expected"]
    if rec.get("judged_by") == "stability":
        return f"steadier training, not a speed change  [{exp['basis']}]"
    if "tokens_per_s" not in exp:
        return f"not modelled  [{exp['basis']}]"
    source = exp.get("source", "modelled")
    gains = [f"tokens/s {range_text(exp['tokens_per_s'])} ({source})"]
    if "peak_memory" in exp:
        modelled = source == "modelled" or "peak_memory" in exp.get("modelled_parts", ())
        gains.append(f"peak memory {range_text(exp['peak_memory'])} ({'modelled' if modelled else source})")
    why = f"; not probed: {exp['not_probed']}" if exp.get("not_probed") else ""
    return f"{', '.join(gains)}  [{exp['basis']}{why}]"


def to_try(rec: Mapping[str, Any]) -> str:
    """How to try a recommendation: the exact change to one's own training (its `change`), else the
    profile-run command that reruns the run with it."""
    change = rec.get("change")
    return str(change["text"]) if change else str(rec["command"])


def rerun_own(run_id: str) -> str:
    """How a run of one's own training is verified: by rerunning the command that trained it."""
    return (f"run {run_id} is your own training: --verify reruns the command that trained it, as it is and with "
            f"each change: glmperf recommend {run_id} --verify -- COMMAND (a Hugging Face or Lightning script with "
            f"the glmperf callback); or make a change, run again, then: glmperf compare {run_id} NEW_RUN")


def measured_text(m: Mapping[str, Any]) -> str:
    """A verified change's measured effect: the change with its interval and the runs behind it."""
    if m.get("metric") == "stability_events":
        return f"stability events {sum(m['base'])} -> {sum(m['cand'])}"
    label = {"tokens_per_s": "tokens/s", "peak_memory": "peak memory"}.get(m["metric"], m["metric"])
    what = "reduction" if m["metric"] == "peak_memory" else "gain"
    runs = f"{m['runs'][0]}+{m['runs'][1]} runs"
    if not all(math.isfinite(float(m[k] if m[k] is not None else math.nan)) for k in ("low_pct", "high_pct")):
        return f"{label} {what} {m['change_pct']:+.1f}% (no interval; {runs})"
    return (f"{label} {what} {m['change_pct']:+.1f}% [{m['low_pct']:+.1f}%, {m['high_pct']:+.1f}%] "
            f"({100 * m['confidence']:.4g}% interval, {runs})")


SHARE_MOVE = 5.0
"""Points of the step a phase's share must move by to be named under a verification."""


def moved_shares(shares: Mapping[str, Mapping[str, float]]) -> str:
    base, cand = shares.get("baseline", {}), shares.get("candidate", {})
    moved = [f"{p} {base[p]:.0f}% -> {cand[p]:.0f}%" for p in base
             if p in cand and abs(cand[p] - base[p]) >= SHARE_MOVE]
    return ", ".join(moved)
