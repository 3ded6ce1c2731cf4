"""A comparison written out: text for a terminal or CI log, markdown for a pull-request comment or
$GITHUB_STEP_SUMMARY, JSON for scripts, JUnit XML for CI test views (one test case per gated check).

Names, units and digits come from the metric registry; nothing here computes a figure.
"""

from __future__ import annotations

import dataclasses
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable

from profiler.compare.gate import LOSS_PARITY
from profiler.compare.runs import Comparison, MetricComparison
from profiler.metrics import METRIC_BY_NAME
from profiler.store import json_text
from profiler.text import fmt

FORMATS = ("text", "markdown", "json", "junit")
SHOWN_CHANGES = 3
"""Phases (and operators, up to compare_runs.TOP_OPS) listed in the text and markdown."""
STEPS_NOTE = "steps as the summary counts them: warmup, compile and torch.profiler steps left out"


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:+.1%}"


def _p(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.2g}"


def _runs(ids: tuple[str, ...]) -> str:
    return f"{len(ids)} run ({ids[0]})" if len(ids) == 1 else f"{len(ids)} runs ({ids[0]}, ...)"


def headline(c: Comparison) -> str:
    """PASS or FAIL and why, in one line."""
    if c.failures:
        what = [f"{m.name} regressed ({_pct(m.estimate.change)})" for m in c.metrics if m.name in c.failures]
        what += [f"{LOSS_PARITY}: the loss curves drift"] if LOSS_PARITY in c.failures else []
        return "FAIL: " + ", ".join(what)
    verdicts = [m.estimate.verdict for m in c.metrics if m.threshold.gated]
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in ("unchanged", "improved", "inconclusive") if v in verdicts)
    return f"PASS: no gated metric regressed ({counts})"


def workload_line(c: Comparison) -> str:
    """Said before any figure when the sides train different models or shapes."""
    if c.different_models is None:
        return ""
    return f"the runs train different models or shapes: {c.different_models}; the figures compare the workloads"


def _contention_line(c: Comparison) -> str:
    """Other processes' CPU beyond what each side's runs left free, when the sampler measured it."""
    if c.contention == (None, None):
        return ""
    base, cand = ("n/a" if x is None else f"{x:.0%}" for x in c.contention)
    return (f"CPU contention (other processes' share of the machine beyond the cores a run left free, most "
            f"during a run): baseline {base}, candidate {cand}")


def _row(m: MetricComparison) -> list[str]:
    e, digits = m.estimate, METRIC_BY_NAME[m.name].digits
    gate = f"gate {m.threshold.text}" if m.threshold.gated else f"shown, {m.threshold.text}"
    return [m.label, m.unit, fmt(e.base, digits), fmt(e.cand, digits), _pct(e.change),
            f"[{_pct(e.ci[0])}, {_pct(e.ci[1])}]", _p(e.p_value), f"{e.verdict} ({gate})"]


def _headers(c: Comparison) -> list[str]:
    return ["metric", "unit", "baseline", "candidate", "change", f"{c.options.confidence:.0%} interval", "p",
            "verdict"]


def _explained(c: Comparison) -> list[tuple[str, str]]:
    """(metric, why) for the gated verdicts and any regression, then the stability warnings of the first
    gated metric that is not unchanged (the runs' steps, said once)."""
    out = []
    for m in c.metrics:
        e = m.estimate
        if m.threshold.gated or e.verdict == "regressed":
            units = e.steps if e.unit == "steps" else e.runs
            out.append((m.name, f"{e.verdict}: {e.reason} (p over {units[0]}+{units[1]} {e.unit})"))
    shaky = next((m for m in c.metrics if m.threshold.gated and m.estimate.verdict != "unchanged"), None)
    return out + ([(shaky.name, f"stability: {w}") for w in shaky.estimate.stability] if shaky else [])


def _changes(c: Comparison) -> tuple[list[list[str]], list[list[str]]]:
    phases = [[p.name, fmt(p.base_ms, 2), fmt(p.cand_ms, 2), f"{p.change_ms:+.2f}", p.description]
              for p in c.phases[:SHOWN_CHANGES] if abs(p.change_ms) >= 0.005]
    ops = [[o.name, fmt(o.base_ms, 2), fmt(o.cand_ms, 2), f"{o.change_ms:+.2f}"] for o in c.ops]
    return phases, ops


def _columns(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def to_text(c: Comparison) -> str:
    lines = [f"glmperf compare: baseline {_runs(c.base)} vs candidate {_runs(c.cand)}", headline(c)]
    lines += [line for line in (workload_line(c), c.across_devices) if line]
    lines += [_contention_line(c)] if _contention_line(c) else []
    lines += ["", *_columns([_headers(c), *(_row(m) for m in c.metrics)])]
    lines += [f"  {name}: {why}" for name, why in _explained(c)]
    lines.append(f"  loss parity: {c.parity.verdict}: {c.parity.reason}")
    phases, ops = _changes(c)
    if phases:
        lines += ["", "where the step time changed (mean ms a step):",
                  *_columns([["phase", "baseline", "candidate", "change", ""], *phases])]
    if ops:
        lines += ["", f"operators whose time changed most ({c.ops_time}, ms per profiled step):",
                  *_columns([["operator", "baseline", "candidate", "change"], *ops])]
    if c.differences:
        lines += ["", "differences between the sides:"]
        lines += [f"  {d.section} {d.key}: {d.base!r} -> {d.cand!r}" for d in c.differences]
    lines += ["", *(f"note: {n}" for n in (*c.notes, STEPS_NOTE))]
    return "\n".join(lines) + "\n"


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    def cell(x: str) -> str:
        return x.replace("|", "\\|").replace("\n", " ")

    return ["| " + " | ".join(map(cell, headers)) + " |", "|" + " --- |" * len(headers),
            *("| " + " | ".join(map(cell, r)) + " |" for r in rows)]


def to_markdown(c: Comparison) -> str:
    lines = [f"### glmperf compare: {headline(c)}", "",
             f"Baseline {_runs(c.base)}, candidate {_runs(c.cand)}.", ""]
    lines += [x for line in (workload_line(c), c.across_devices) if line for x in (f"**{line}**", "")]
    lines += [_contention_line(c), ""] if _contention_line(c) else []
    lines += [*_md_table(_headers(c), [_row(m) for m in c.metrics]), ""]
    lines += [f"- `{name}`: {why}" for name, why in _explained(c)]
    lines += [f"- loss parity: {c.parity.verdict}: {c.parity.reason}", ""]
    phases, ops = _changes(c)
    if phases:
        lines += ["Where the step time changed (mean ms a step):", "",
                  *_md_table(["phase", "baseline", "candidate", "change", "what"], phases), ""]
    if ops:
        lines += [f"Operators whose time changed most ({c.ops_time}, ms per profiled step):", "",
                  *_md_table(["operator", "baseline", "candidate", "change"], ops), ""]
    if c.differences:
        lines += ["<details><summary>Differences between the sides</summary>", "",
                  *_md_table(["", "key", "baseline", "candidate"],
                             [[d.section, f"`{d.key}`", repr(d.base), repr(d.cand)] for d in c.differences]),
                  "", "</details>", ""]
    lines += [f"_{n}_  " for n in (*c.notes, STEPS_NOTE)]
    return "\n".join(lines) + "\n"


def to_json(c: Comparison) -> str:
    data = dataclasses.asdict(c)
    for key, changes in (("phases", c.phases), ("ops", c.ops)):
        for row, change in zip(data[key], changes, strict=True):
            row["change_ms"] = change.change_ms
    data = {"verdict": c.verdict, "passed": not c.failures, "failures": list(c.failures), **data}
    return json_text(data) + "\n"


def to_junit(c: Comparison) -> str:
    suite = ET.Element("testsuite", name="glmperf compare")
    cases = [(f"{m.name} {m.threshold.text}", m.estimate.verdict, f"{m.estimate.verdict}: {_pct(m.estimate.change)}, "
              f"{m.estimate.reason}") for m in c.metrics if m.threshold.gated]
    if c.parity_threshold.gated:
        verdict = "regressed" if c.parity.verdict == "drift" else c.parity.verdict
        cases.append((f"{LOSS_PARITY} {c.parity_threshold.text}", verdict, f"{c.parity.verdict}: {c.parity.reason}"))
    for name, verdict, message in cases:
        case = ET.SubElement(suite, "testcase", classname="glmperf.compare", name=name)
        if verdict == "regressed":
            ET.SubElement(case, "failure", message=message, type="regression").text = message
        elif verdict in ("inconclusive", "not comparable"):
            ET.SubElement(case, "skipped", message=message)
    ET.SubElement(suite, "system-out").text = to_text(c)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(v == "regressed" for _, v, _ in cases)))
    suite.set("skipped", str(sum(v in ("inconclusive", "not comparable") for _, v, _ in cases)))
    suite.set("errors", "0")
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


RENDER: dict[str, Callable[[Comparison], str]] = {"text": to_text, "markdown": to_markdown, "json": to_json,
                                                  "junit": to_junit}
