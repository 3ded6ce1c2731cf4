"""The report of one run: verdict first (what ran, the top bottleneck, the top recommendation with its
command), then the figures, then the tables. Works for every run that can be read: a failed,
interrupted, running or killed run's report says so and shows what was measured.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from optimizers.config import ConfigError
from profiler import text
from profiler.analysis import RunData, RunRecord, summary_of
from profiler.metrics import flatten, lookup
from profiler.settings import settings_text
from reports import figures_advice, figures_machine, figures_run, html
from reports.collectives_across import CAPTION, across_ranks

BANNERS = {
    "failed": ("This run failed after {total} recorded step(s). The figures and tables show what was measured "
               "before it stopped.", True),
    "interrupted": ("This run was interrupted (SIGINT/SIGTERM) after {total} recorded step(s). The figures and "
                    "tables show what was measured until then.", False),
    "running": ("This run is still running: {total} step(s) flushed so far. Write the report again for the rest.",
                False),
    "incomplete": ("This run was killed: its process is gone after {total} flushed step(s). `glmperf finalize "
                   "{id}` stores its summary.", True),
}


def diagnosis_of(run: RunData, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The run's stored diagnosis (what profile-run printed), else one computed now, else none."""
    if run.diagnosis:
        return dict(run.diagnosis)
    if not summary.get("steps_counted"):
        return {}
    from profiler.advice.advise import advise  # imports torch: only for runs stored without a diagnosis

    return advise(run)


def preset_changes(run: RunRecord) -> list[str]:
    """The config keys whose values differ from the run's preset, as `key=value` a user would type;
    ConfigError when the preset is not known. profile-run stores them with the run; for a run stored
    without them they are computed now, which imports torch (the preset's config needs the catalog)."""
    if run.preset_changes is not None:
        return run.preset_changes
    if run.own_model:  # no preset to differ from
        return []
    from profiler.config import preset_changes as computed

    return computed(run.config, run.world_size)


def changed_from_preset(run: RunData) -> str:
    """The config keys whose values differ from the run's preset, as `key=value` a user would type."""
    if run.own_model:
        return f"no preset: the model is its own ({run.source} run)"
    try:
        changed = preset_changes(run)
    except ConfigError as exc:
        return f"not known ({exc})"
    return ", ".join(changed) or "nothing: the preset as shipped"


def what_ran(run: RunData, summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    env, sampling = run.environment, run.sampling
    versions = f"torch {env.get('torch')}, CUDA {env.get('cuda') or 'none'}, Python {env.get('python')}"
    return [
        ("status", f"{run.status}: {summary.get('steps_counted', 0)} of {summary.get('steps_total', 0)} "
                   "recorded steps counted"),
        ("preset", str(lookup(run.config, "model.preset"))),
        ("changed from the preset", changed_from_preset(run)),
        ("device", f"{env.get('device_name')} ({env.get('device')}), {run.world_size} rank(s)"),
        ("versions", versions),
        ("sampling", f"{sampling.get('source')} at {sampling.get('hz')} Hz ({sampling.get('why') or 'NVML'})"),
        ("switches applied", ", ".join(map(str, run.switches_applied)) or "none (the defaults)"),
    ]


def verified_text(result: Mapping[str, Any] | None) -> str:
    if not result:
        return "not verified"
    m = result.get("measured") or {}
    if not all(isinstance(m.get(k), (int, float)) for k in ("change_pct", "low_pct", "high_pct")):
        return f"{result.get('verdict')}: {result.get('reason', '')}"
    return (f"{result.get('verdict')}: {m.get('metric')} {m['change_pct']:+.1f}% ({m['low_pct']:+.1f}% to "
            f"{m['high_pct']:+.1f}%); {result.get('reason', '')}")


def verdict_of(diagnosis: Mapping[str, Any], verification: Mapping[str, Any] | None) -> dict[str, Any]:
    found = diagnosis.get("bottlenecks") or []
    recs = diagnosis.get("recommendations") or []
    top = recs[0] if recs else None
    return {
        "text": diagnosis.get("verdict") or "not diagnosed: the run has no counted step",
        "bottleneck": {"kind": found[0]["kind"], "explains": f"{100 * found[0]['severity']:.0f}% of the step",
                       "message": found[0]["message"]} if found else None,
        "recommendation": {"settings": settings_text(top["set"]), "expected": text.expected_text(top),
                           "command": text.to_try(top),
                           "verified": verified_text(figures_advice.verified(top, verification))
                           if verification else ""} if top else None,
    }


def run_tables(run: RunData, diagnosis: Mapping[str, Any], verification: Mapping[str, Any] | None) -> dict[str, Any]:
    evidence = [
        "; ".join(f"{name} {text.fmt(f.get('value'), 2)} {f.get('unit', '')} [{f.get('source', '')}]"
                  for name, f in (b.get("evidence") or {}).items()) for b in diagnosis.get("bottlenecks") or []]
    return {
        "bottlenecks": [[b["kind"], f"{100 * b['severity']:.0f}%", b["message"], f"{b['rule']}: {b['threshold']}", e]
                        for b, e in zip(diagnosis.get("bottlenecks") or [], evidence, strict=True)],
        "skipped": [[s["rule"], s["reason"]] for s in diagnosis.get("skipped") or []],
        "recommendations": [[settings_text(r["set"]), r.get("for", ""), text.expected_text(r),
                             verified_text(figures_advice.verified(r, verification)), r.get("risk", ""),
                             text.to_try(r)] for r in diagnosis.get("recommendations") or []],
        "verification": (f"Verified by rerunning: {verification.get('repeats')} repeat(s) of "
                         f"{verification.get('steps')} steps against baseline run(s) "
                         f"{', '.join(verification.get('baseline_runs') or [])}." if verification else ""),
        "excluded": [[settings_text(e["set"]), e["reason"]] for e in diagnosis.get("excluded") or []],
        "ranks": [[r.get("rank"), r.get("status"), r.get("host"), r.get("pid"), r.get("error") or ""]
                  for r in run.ranks],
        "environment": [(k, str(v)) for k, v in flatten(run.environment).items()],
        "config": [(k, str(v)) for k, v in flatten(run.config).items()],
    }


def run_figures(run: RunData, summary: Mapping[str, Any], diagnosis: Mapping[str, Any],
                verification: Mapping[str, Any] | None) -> list[tuple[str, go.Figure | None, str]]:
    """Every figure of a run's report in order: (name, figure or None, why it would be missing); the
    HTML report and the dashboard show these."""
    single = "a single process has no collectives" if run.world_size == 1 else "no collectives were measured"
    return [
        ("Step-time breakdown", figures_run.step_breakdown(run, summary), "no counted step"),
        ("Step time over the run", figures_run.step_times(run), "no step recorded"),
        ("Throughput and MFU", figures_run.throughput(run, summary), "no step recorded"),
        ("Memory over the run", figures_run.memory(run), "memory was not measured"),
        ("Device samples", figures_machine.device_samples(run), "no sample during the steps"),
        ("Data wait and reads", figures_machine.data_wait(run, summary), "no step recorded"),
        ("Communication", figures_machine.communication(run, summary), single),
        ("Communication by collective", figures_machine.collectives(summary), single),
        ("Top operators", figures_machine.top_operators(run), "no torch.profiler window (profile.trace=false, or "
                                                              "the run stopped before it)"),
        ("Loss and grad norm", figures_advice.stability(run), "no loss recorded (no step ran, or the run is an "
                                                              "imported trace)"),
        ("Bottleneck evidence", figures_advice.bottlenecks(diagnosis), "no bottleneck found"),
        ("Recommendations", figures_advice.recommendations(diagnosis.get("recommendations") or [], verification),
         "no recommendation with a speed or memory gain"),
    ]


def run_report(run: RunData) -> str:
    """The HTML report of a stored run (any status a run can be read in)."""
    summary = summary_of(run)
    diagnosis = diagnosis_of(run, summary)
    verification = run.verification
    shown, missing = html.sections(run_figures(run, summary, diagnosis, verification))
    banner = BANNERS.get(run.status)
    return html.render(
        "run.html", title=f"glmperf: run {run.id}", sections=shown, missing=missing,
        run={"id": run.id, "name": run.name, "status": run.status, "path": str(run.path),
             "created": run.created, "ended": run.ended_at, "error": run.error},
        banner={"text": banner[0].format(total=summary.get("steps_total", 0), id=run.id), "bad": banner[1]}
        if banner else None,
        what_ran=what_ran(run, summary), verdict=verdict_of(diagnosis, verification),
        summary_rows=text.summary_rows(run.record, summary, run.status), notes=summary.get("notes", []),
        written=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        across=across_ranks(summary), across_caption=CAPTION,
        **run_tables(run, diagnosis, verification))
