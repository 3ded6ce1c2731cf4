"""What several pages show alike: the state of a runs directory or a run, figures with their captions,
tables with their headers, and the run a page is about (its `run` query parameter)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from app import data
from profiler.analysis import RunRecord
from reports.collectives_across import CAPTION, across_ranks
from reports.plotting import caption
from reports.report_run import BANNERS


def no_runs(runs_dir: Path, runs: Sequence[RunRecord]) -> bool:
    """Say so when there is nothing to show (no runs directory, or no run in it); True then."""
    name = runs_dir.name  # no page shows where the server keeps its files
    if not runs_dir.is_dir():
        st.info(f"No runs directory at `{name}` yet. `profile-run --preset tiny --runs-dir {name}` makes one with a "
                "first run; `glmperf dashboard --runs-dir DIR` reads another.")
        return True
    if not runs:
        st.info(f"No runs in `{name}` yet. `profile-run --preset tiny --runs-dir {name}` makes one; this page shows "
                "it as soon as it starts.")
        return True
    return False


def run_state(view: data.RunView) -> None:
    """The banner of a run that is not simply completed: failed, interrupted, still running, killed."""
    run = view.run
    if run is None or run.status not in BANNERS:
        return
    total = view.summary.get("steps_total", 0)
    text, bad = BANNERS[run.status]
    text = (f"This run is still running: {total} step(s) flushed so far. This page refreshes as more come."
            if run.status == "running" else text.format(total=total, id=run.id))
    error = run.error
    (st.error if bad or run.status == "failed" else st.warning)(text + (f"\n\nError: `{error}`" if error else ""))


def figures(figs: data.Figures, *, key: str) -> None:
    """Each figure with its caption, as in the HTML report; the ones left out listed with why."""
    missing = []
    for i, (name, fig, why) in enumerate(figs):
        if fig is None:
            missing.append(f"{name}: {why}")
            continue
        st.plotly_chart(fig, theme=None, key=f"{key}-{i}")
        st.caption(caption(fig))
    if missing:
        st.caption("Not shown: " + "; ".join(missing))


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    """A table of strings (a report table's rows) with its headers."""
    st.dataframe(pd.DataFrame([list(map(str, r)) for r in rows], columns=list(headers)), hide_index=True)


def pick_run(ids: Sequence[str], *, label: str, key: str) -> str | None:
    """The run a page is about: its `run` query parameter, else the user's pick (newest first), kept in
    the URL so the page can be shared."""
    wanted = st.query_params.get("run")
    options = list(ids) if wanted is None or wanted in ids else [wanted, *ids]
    if not options:
        return None
    chosen = st.selectbox(label, options, index=options.index(wanted) if wanted in options else 0, key=key)
    if chosen is not None and chosen != wanted:
        st.query_params["run"] = chosen
    return chosen


def collectives_across_ranks(summary: dict[str, Any]) -> None:
    """The collectives matched across ranks, as the HTML report tables them; nothing for a run without."""
    across = across_ranks(summary)
    if across is None:
        return
    st.subheader("Collectives across ranks")
    table(across.rows, across.headers)
    st.markdown(across.straggler)
    if across.clocks:
        st.markdown(across.clocks)
    st.caption(" ".join([CAPTION, *(f"Link peak: {link}." for link in across.links)]))
