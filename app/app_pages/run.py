"""Run: one run's verdict, headline figures, recommendations with the commands that try them (for
one's own training, the exact changes to make), the report's figures and tables, and downloads; a
running run refreshes itself as its steps are flushed."""

from __future__ import annotations

import functools

import streamlit as st

from app import data, widgets
from profiler import text
from profiler.analysis import RunData
from profiler.metrics import METRIC_BY_NAME
from profiler.settings import settings_text
from reports import report_run
from reports.figures_advice import verified
from reports.paths import plain_name

REFRESH_S = 2.0  # how often a running run's page reads it again (runs flush every 2 s by default)
HEADLINE = ("tokens_per_s", "step_time_p50", "peak_memory", "mfu")


def _verdict(view: data.RunView) -> None:
    verdict = report_run.verdict_of(view.diagnosis, view.verification)
    st.subheader("Verdict")
    st.markdown(f"**Diagnosis:** {verdict['text']}")
    if verdict["bottleneck"]:
        b = verdict["bottleneck"]
        st.markdown(f"**Top bottleneck:** {b['kind']} (explains {b['explains']}): {b['message']}")
    for col, name in zip(st.columns(len(HEADLINE)), HEADLINE, strict=True):
        col.metric(METRIC_BY_NAME[name].label, data.fmt_metric(name, view.summary))


def _recommendations(view: data.RunView, run: RunData) -> None:
    recs = view.diagnosis.get("recommendations") or []
    st.subheader("Recommendations")
    if not recs:
        st.caption("No recommendation: nothing in the catalog addresses what was found here and can run on this "
                   "device." if view.diagnosis else "Not diagnosed: the run has no counted step yet.")
        return
    for rec in recs:
        st.markdown(f"**{settings_text(rec['set'])}** (for {rec.get('for', '')}; risk: {rec.get('risk', '')})  \n"
                    f"expected: {text.expected_text(rec)}  \n"
                    f"verified: {report_run.verified_text(verified(rec, view.verification))}")
        st.code(text.to_try(rec), language="python" if "change" in rec else "bash")
    st.page_link("app_pages/recommend.py", label="Verify these by rerunning", query_params={"run": run.id})


def _downloads(run: RunData) -> None:
    traces = data.trace_paths(run.path)
    cols = st.columns(1 + len(traces))
    name = plain_name(run.id)
    cols[0].download_button("HTML report", lambda: data.report_html(run.path), file_name=f"{name}-report.html",
                            mime="text/html", on_click="ignore")
    for col, path in zip(cols[1:], traces, strict=True):
        col.download_button(f"trace {path.name}", functools.partial(data.file_bytes, path),
                            file_name=f"{name}-{plain_name(path.name)}", mime="application/gzip", on_click="ignore")


def _tables(view: data.RunView, run: RunData) -> None:
    tables = report_run.run_tables(run, view.diagnosis, view.verification)
    with st.expander("Summary and what ran"):
        widgets.table(text.summary_rows(run.record, view.summary, run.status), ["figure", "value"])
        for note in view.summary.get("notes", []):
            st.caption(f"note: {note}")
        widgets.table(report_run.what_ran(run, view.summary), ["what", "value"])
    if tables["bottlenecks"]:
        with st.expander("Bottlenecks"):
            widgets.table(tables["bottlenecks"], ["bottleneck", "explains", "what was found", "rule", "evidence"])
    with st.expander("Ranks, environment and config"):
        widgets.table(tables["ranks"], ["rank", "status", "host", "pid", "error"])
        widgets.table(tables["environment"], ["environment", "value"])
        widgets.table(tables["config"], ["config", "value"])


def _show(view: data.RunView) -> None:
    run = view.run
    if view.error or run is None:
        st.error(view.error)
        return
    st.header(run.id)
    st.caption(f"{run.status} · name {run.name} · created {run.created}"
               + (f" · ended {run.ended_at}" if run.ended_at else "") + f" · `{data.shown(str(run.path), runs_dir)}`")
    widgets.run_state(view)
    _verdict(view)
    _recommendations(view, run)
    _downloads(run)
    st.subheader("Figures")
    widgets.figures(view.figures, key="run")
    widgets.collectives_across_ranks(view.summary)
    _tables(view, run)


runs_dir = data.runs_dir()
st.title("Run")
runs = data.records(runs_dir)
if widgets.no_runs(runs_dir, runs):
    st.stop()
run_id = widgets.pick_run([r.id for r in runs], label="Run", key="run")
if run_id is None:
    st.stop()
first = data.run_view(run_id, runs_dir)


if first.status == "running":
    @st.fragment(run_every=REFRESH_S)
    def live(run_id: str) -> None:  # the page's body, read again every REFRESH_S while the run runs
        view = data.run_view(run_id, runs_dir)
        if view.status != first.status:
            st.rerun()  # it ended (or was killed): the whole page, which stops refreshing
        _show(view)

    live(run_id)
else:
    _show(first)
