"""Compare: a baseline and one or more candidates, as `glmperf compare` judges them with the default
gate: the verdict, the delta table with intervals and a verdict per metric, the report's figures."""

from __future__ import annotations

import streamlit as st

from app import data, widgets
from profiler.compare.formats import headline
from reports.paths import plain_name
from reports.report_compare import metric_rows

METRIC_HEADERS = ["metric", "unit", "baseline", "candidate", "change", "interval", "p", "threshold", "verdict", "why"]

runs_dir = data.runs_dir()
st.title("Compare")
runs = data.records(runs_dir)
if widgets.no_runs(runs_dir, runs):
    st.stop()
done = data.completed_ids(runs)
wanted_base, wanted_cand = st.query_params.get_all("base"), st.query_params.get_all("cand")
left, right = st.columns(2)
options = list(dict.fromkeys([*wanted_base, *wanted_cand, *done]))  # a linked run stays, to say what is wrong
base = left.multiselect("Baseline", options, default=wanted_base or done[1:2], key="base")
cand = right.multiselect("Candidates", options, default=wanted_cand or done[:1], key="cand")
if (base, cand) != (wanted_base, wanted_cand):
    st.query_params.from_dict({"base": base, "cand": cand})
if len(done) < 2 and not (base and cand):
    st.info(f"A comparison needs two completed runs; {len(done)} in `{runs_dir.name}`.")
    st.stop()
if not base or not cand:
    st.info("Pick a baseline and at least one candidate.")
    st.stop()

view = data.compare_view(runs_dir, base, cand)
c = view.comparison
if view.error or c is None:
    st.error(f"Cannot compare: {view.error}")
    st.stop()
(st.error if c.failures else st.success)(f"Verdict: {c.verdict}. {headline(c)}")
st.caption(f"loss parity: {c.parity.verdict}: {c.parity.reason}")
for line in filter(None, [c.across_devices, *c.notes]):
    st.caption(line)
st.download_button("HTML report", lambda: data.compare_html(runs_dir, base, cand),
                   file_name=f"compare-{plain_name(c.base[0])}-vs-{plain_name(c.cand[0])}.html", mime="text/html",
                   on_click="ignore")
st.subheader("Metrics")
widgets.table(metric_rows(c), METRIC_HEADERS)
st.subheader("Figures")
widgets.figures(view.figures, key="compare")
with st.expander("Phases, operators and differences"):
    widgets.table([[p.name, f"{p.base_ms:.2f}", f"{p.cand_ms:.2f}", f"{p.change_ms:+.2f}"] for p in c.phases],
                  ["phase", "baseline ms", "candidate ms", "change ms"])
    widgets.table([[o.name, f"{o.base_ms:.3f}", f"{o.cand_ms:.3f}", f"{o.change_ms:+.3f}"] for o in c.ops],
                  ["operator", "baseline ms", "candidate ms", "change ms"])
    st.caption(f"operators: {c.ops_time}")
    widgets.table([[d.section, d.key, d.base, d.cand] for d in c.differences],
                  ["section", "key", "baseline", "candidate"])
