"""What the command line prints for people: a run's summary table and the list of runs.

Plain text, never markup: values come from data (paths, errors from other processes, notes with
brackets) and are printed as they are. Names and units come from the metric registry
(profiler.metrics), so the table says what compare and the reports say.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from profiler import store
from profiler.analysis.comm import collectives_by_rank
from profiler.metrics import METRIC_BY_NAME
from profiler.settings import settings_text
from profiler.text import expected_text, fmt, measured_text, moved_shares, summary_rows, to_try


def print_table(rows: Iterable[tuple[str, str]], out: TextIO, *, title: str = "") -> None:
    rows = list(rows)
    width = max((len(name) for name, _ in rows), default=0)
    if title:
        print(title, file=out)
    for name, value in rows:
        lines = value.splitlines() or [""]
        print(f"  {name:<{width}}  {lines[0]}", file=out)
        for more in lines[1:]:
            print(f"  {'':<{width}}  {more}", file=out)


def print_summary(record: Mapping[str, Any], summary: Mapping[str, Any], status: str, path: Path,
                  out: TextIO) -> None:
    """The run's table, its notes, and where its files are."""
    print_table(summary_rows(record, summary, status), out, title=f"run {record.get('id')}")
    print_collectives(collectives_by_rank(summary), out)
    for note in summary.get("notes", []):
        print(f"  note: {note}", file=out)
    print(f"run:    {path}", file=out)
    report = store.report_path(Path(path))
    if report is not None:
        print(f"report: {report}", file=out)


def print_collectives(ranks: Mapping[str, Mapping[str, Any]], out: TextIO) -> None:
    """Each rank's collectives a profiled step (from its trace): calls, payload, time and exposed time."""
    rows = [(rank, kind, k) for rank, found in ranks.items() for kind, k in found["kinds"].items()]
    if not rows:
        return
    print(f"  {'collectives a profiled step':<34} {'calls':>7} {'MiB':>9} {'time ms':>9} {'exposed ms':>11}", file=out)
    for rank, kind, k in rows:
        print(f"  {'rank ' + rank + ' ' + kind:<34} {fmt(k['calls'], 1):>7} {fmt(k['bytes'] / 2**20, 3):>9} "
              f"{fmt(1e3 * k['time_s'], 2):>9} {fmt(1e3 * k['exposed_s'], 2):>11}", file=out)


def print_runs(runs: list[dict[str, Any]], out: TextIO) -> None:
    """One line per run: id, status, throughput, median step, and what is wrong with a corrupt or unreadable
    one (under its status)."""
    tps, p50 = METRIC_BY_NAME["tokens_per_s"], METRIC_BY_NAME["step_time_p50"]
    width = max(len(str(r.get("id"))) for r in runs)
    print(f"{'run':<{width}}  {'status':<11} {'tokens/s':>10} {'step p50':>10}  path", file=out)
    for r in runs:
        summary = r.get("summary") or {}
        line = (f"{r.get('id')!s:<{width}}  {r['status']:<11} {fmt(tps.value(summary), 0):>10} "
                f"{fmt(p50.value(summary), 1) + ' ms':>10}  {r['path']}")
        print(line, file=out)
        for problem in r.get("problems", []):
            print(f"{'':<{width}}  {r['status']}: {problem}", file=out)


def _figure(name: str, f: Mapping[str, Any]) -> str:
    return f"{name} {fmt(f.get('value'), 2)} {f.get('unit', '')} [{f.get('source', '')}]"


def print_diagnosis(run_id: str, advice: Mapping[str, Any], out: TextIO, *, evidence: bool = True) -> None:
    """The bottlenecks by severity, each with the rule, threshold and evidence; then what was skipped."""
    print(f"diagnosis of run {run_id}: {advice['verdict']}", file=out)
    for i, b in enumerate(advice["bottlenecks"], 1):
        print(f"  {i}. {b['kind']} (explains {100 * b['severity']:.0f}%): {b['message']}", file=out)
        if evidence:
            print(f"     rule {b['rule']} (docs/diagnosis.md): {b['threshold']}", file=out)
            for name, f in b["evidence"].items():
                print(f"     evidence: {_figure(name, f)}", file=out)
    for s in advice.get("skipped", []):
        print(f"  skipped {s['rule']}: {s['reason']}", file=out)


def _print_block(label: str, text: str, out: TextIO) -> None:
    """`label: text`, the text's further lines under its first (a change that is lines of code)."""
    first, *more = text.splitlines() or [""]
    print(f"{label}{first}", file=out)
    for line in more:
        print(f"{' ' * len(label)}{line}", file=out)


def print_recommendations(run_id: str, advice: Mapping[str, Any], out: TextIO) -> None:
    """The ranked changes, each with its expected gain, risk and the command that tries it (for one's own
    training: the exact change to make)."""
    recs = advice["recommendations"]
    if not recs:
        why = advice.get("not_recommended") or ("nothing in the catalog addresses what was found here and can "
                                                "run on this device")
        print(f"no recommendation for run {run_id}: {why}", file=out)
    for i, r in enumerate(recs, 1):
        settings = settings_text(r["set"])
        print(f"  {i}. {settings}  (for {r['for']}; risk: {r['risk']})", file=out)
        print(f"     expected: {expected_text(r)}", file=out)
        for note in r["notes"]:
            print(f"     note: {note}", file=out)
        _print_block("     change: " if "change" in r else "     try: ", to_try(r), out)
    probes = advice.get("probes")
    if probes:
        end = probes.get("at_run_end")
        at_end = f"; {end['measured']} measured at the run's end in {end['seconds']:.1f} s" if end else ""
        print(f"  probes: {probes['measured']} measured in {probes['spent_s']:.0f} s, {probes['cached']} cached "
              f"(budget {probes['budget_s']:.0f} s{at_end})", file=out)
    elif recs and advice.get("framework"):
        print(f"  (verify them: `glmperf recommend {run_id} --verify -- COMMAND` reruns the command that trained it "
              f"with each change)", file=out)
    elif recs and all(r["expected"].get("source", "modelled") == "modelled" for r in recs):
        print(f"  (modelled ranges: `glmperf recommend {run_id}` measures them on this machine)", file=out)
    hidden = [e for e in advice.get("excluded", []) if e["reason"].startswith("changes the model")]
    if hidden and not advice.get("allow_model_changes"):
        print(f"  ({len(hidden)} change(s) that alter the model not shown: --allow-model-changes)", file=out)


def print_advice_head(run_id: str, advice: Mapping[str, Any], out: TextIO) -> None:
    """Under a run's table: the top bottleneck and the top recommendation, with how to see all."""
    if not advice.get("verdict"):
        return
    print(f"diagnosis: {advice['verdict']}", file=out)
    if advice.get("recommendations"):
        top = advice["recommendations"][0]
        _print_block("try:       ", to_try(top), out)
        print(f"           expected: {expected_text(top)} (all: glmperf recommend {run_id})", file=out)


def print_verification(run_id: str, verification: Mapping[str, Any], out: TextIO) -> None:
    """Each verified recommendation: verdict, measured gain with its interval next to the expected range."""
    state = "" if verification.get("complete", True) else " (stopped before the end: partial)"
    runs = f"{shlex.join(verification['command'])} as it is" if verification.get("command") else \
        f"{verification['steps']} steps"
    print(f"verification of run {run_id}: {verification['repeats']} repeat(s) of {runs}, "
          f"interleaved with a fresh baseline{state}", file=out)
    for r in verification["results"]:
        settings = settings_text(r["set"])
        print(f"  {r['verdict']:<16} {settings}", file=out)
        if r.get("expected"):
            print(f"     expected: {expected_text(r)}", file=out)
        if r.get("measured"):
            print(f"     measured: {measured_text(r['measured'])}", file=out)
            moved = moved_shares(r["measured"].get("shares") or {})
            if moved:
                print(f"     step shares: {moved}", file=out)
        print(f"     why: {r['reason']}", file=out)
    for r in verification.get("refused", []):
        print(f"  not run          {r['label']}: {r['reason']}", file=out)
