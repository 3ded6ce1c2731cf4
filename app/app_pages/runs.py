"""Runs: every run of the runs directory, filtered and sorted; open one, or select several to compare."""

from __future__ import annotations

import streamlit as st

from app import data, widgets
from profiler.metrics import METRIC_BY_NAME

# sort key -> ascending: newest first, and each metric best first (its registry direction)
SORTS = {"created": False, "name": True, "status": True,
         **{label: METRIC_BY_NAME[name].better == "lower" for label, name in data.METRIC_COLUMNS.items()}}

runs_dir = data.runs_dir()
st.title("Runs")
st.caption(f"Runs directory: `{runs_dir.name}`")
runs = data.records(runs_dir)
if widgets.no_runs(runs_dir, runs):
    st.stop()

table = data.runs_table(runs)
left, mid, right = st.columns([3, 2, 1])
text = left.text_input("Filter", placeholder="id, name, preset, switch or bottleneck", key="filter")
statuses = mid.multiselect("Status", sorted(table["status"].astype(str).unique()), key="statuses")
sort = right.selectbox("Sort by", list(SORTS), key="sort") or next(iter(SORTS))  # None only without options

shown = table
if text:
    words = shown[["run", "name", "preset", "switches changed", "top bottleneck"]].astype(str).agg(" ".join, axis=1)
    shown = shown[words.str.contains(text, case=False, regex=False)]
if statuses:
    shown = shown[shown["status"].isin(statuses)]
shown = shown.sort_values(sort, ascending=SORTS[sort], na_position="last", kind="stable", ignore_index=True)

counts = table["status"].value_counts()
st.caption(f"{len(shown)} of {len(table)} runs shown · " + ", ".join(f"{n} {s}" for s, n in counts.items()))
if shown.empty:
    st.info("No run matches the filter.")
    st.stop()

digits = {label: METRIC_BY_NAME[name].digits for label, name in data.METRIC_COLUMNS.items()}
event = st.dataframe(
    shown, hide_index=True, key="runs", on_select="rerun", selection_mode="multi-row",
    column_config={"open": st.column_config.LinkColumn("open", display_text="open"),
                   "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm:ss"),
                   **{label: st.column_config.NumberColumn(label, format=f"%.{d}f") for label, d in digits.items()}})

picked = [str(shown["run"].iloc[i]) for i in event.selection.rows]
if not picked:
    st.caption("Select a row to open its run, or several to compare them (the oldest is the baseline).")
elif len(picked) == 1:
    st.page_link("app_pages/run.py", label=f"Open run {picked[0]}", query_params={"run": picked[0]})
    st.page_link("app_pages/recommend.py", label=f"Recommendations for {picked[0]}", query_params={"run": picked[0]})
else:
    by_age = sorted(picked, key=lambda r: str(table.loc[table["run"] == r, "created"].iloc[0]))
    unfinished = [r for r in by_age if r not in data.completed_ids(runs)]
    if unfinished:
        st.warning(f"A comparison needs completed runs; not completed: {', '.join(unfinished)}.")
    else:
        st.page_link("app_pages/compare.py", label=f"Compare {by_age[0]} (baseline) with {', '.join(by_age[1:])}",
                     query_params={"base": by_age[0], "cand": by_age[1:]})
