"""Recommend: a run's recommendations and their verification by rerunning (started from here as a
background `glmperf recommend --verify`, whose progress shows and survives a reload), the sweeps
with their ablation and Pareto front, and the tunes round by round with the config they ended in."""

from __future__ import annotations

from datetime import datetime, timezone

import streamlit as st

from app import data, jobs, widgets
from profiler import text
from reports.report_run import run_tables
from reports.report_sweep import BANNERS as SWEEP_BANNERS

REFRESH_S = 2.0
REC_HEADERS = ["change", "for", "expected", "verified", "risk", "to try"]
CELL_HEADERS = ["cell", "settings", "status", "tokens/s (low to high)", "peak memory GiB (low to high)", "runs"]


def _progress(run_id: str, job: jobs.Job) -> None:
    since = datetime.fromtimestamp(job.started, timezone.utc).isoformat(timespec="seconds")
    made = [r for r in data.linked_runs(data.records(runs_dir), run_id) if str(r.created or "") >= since]
    state = "running" if job.running else "finished"
    st.markdown(f"**Verification {state}** (started {since}, pid {job.pid}): {len(made)} run(s) made so far"
                + (f", the last {made[-1].id} ({made[-1].status})" if made else ""))
    st.code(data.shown(job.tail(), runs_dir) or "(no output yet)", language="text")


def _verify(run_id: str) -> None:
    view = data.run_view(run_id, runs_dir)
    run = view.run
    if view.error or run is None:
        st.error(view.error)
        return
    widgets.run_state(view)
    recs = view.diagnosis.get("recommendations") or []
    if not recs:
        st.info("No recommendation to verify: nothing in the catalog addresses what was found in this run."
                if view.diagnosis else "Not diagnosed: the run has no counted step.")
        return
    tables = run_tables(run, view.diagnosis, view.verification)
    widgets.figures([f for f in view.figures if f[0] == "Recommendations"], key="recommend")
    if run.source == "api":
        widgets.table(tables["recommendations"], REC_HEADERS)
        st.info(text.rerun_own(run.id))
        return
    st.caption(tables["verification"] or "Not verified yet: start a verification below.")
    widgets.table(tables["recommendations"], REC_HEADERS)

    job = jobs.find(run_id, runs_dir)
    a, b, c = st.columns(3)
    top = a.number_input("Recommendations to verify", 1, len(recs), min(3, len(recs)), key="top")
    repeats = b.number_input("Repeats of each side", 1, 10, 3, key="repeats")
    steps = c.number_input("Steps a run (0: the run's own)", 0, 100_000, 0, key="steps")
    busy = job is not None and job.running
    if st.button("Verify by rerunning", disabled=busy or run.status != "completed", key="verify",
                 help="Runs `glmperf recommend RUN --verify` in the background: a fresh baseline and each change, "
                      "interleaved; the verdicts land above."):
        job = jobs.start(run_id, runs_dir, top=int(top), repeats=int(repeats), steps=int(steps) or None)
        busy = True
    if job is None:
        return
    if not busy:
        _progress(run_id, job)
        return

    @st.fragment(run_every=REFRESH_S)
    def progress() -> None:  # read again every REFRESH_S while it runs; the whole page once it ends
        _progress(run_id, job)
        if not job.running:
            st.rerun()

    progress()


def _sweeps() -> None:
    found = data.sweeps(runs_dir)
    if not found:
        st.info(f"No sweeps in `{runs_dir.name}/sweeps`. `glmperf sweep --preset tiny --grid switches.amp=off,bf16` "
                "runs one.")
        return
    ids = [s["id"] for s in found]
    wanted = st.query_params.get("sweep")
    chosen = st.selectbox("Sweep", ids, index=ids.index(wanted) if wanted in ids else 0, key="sweep")
    sweep = found[ids.index(chosen)]
    if sweep.get("error"):
        st.error(sweep["error"])
        return
    if sweep["record"].get("status") in SWEEP_BANNERS:
        st.warning(SWEEP_BANNERS[sweep["record"]["status"]])
    best = sweep["best"]
    st.markdown(f"**Fastest:** {best['fastest']}  \n**Smallest:** {best['smallest']}  \n**Pareto front:** "
                f"{best['front']}")
    widgets.figures(sweep["figures"], key="sweep")
    widgets.table(sweep["cells"], CELL_HEADERS)


def _tunes() -> None:
    found = data.tunes(runs_dir)
    if not found:
        st.info(f"No tunes in `{runs_dir.name}/tunes`. `glmperf tune --preset tiny --steps 20` runs one.")
        return
    ids = [t["id"] for t in found]
    wanted = st.query_params.get("tune")
    chosen = st.selectbox("Tune", ids, index=ids.index(wanted) if wanted in ids else 0, key="tune")
    tune = found[ids.index(chosen)]
    if tune.get("error"):
        st.error(tune["error"])
        return
    record = tune["record"]
    st.markdown(f"**Status:** {record.get('status')}  \n**Stopped:** {record.get('stopped') or 'still running'}")
    tuned = record.get("tuned")
    if tuned:
        start, end = tuned["start"], tuned["end"]
        st.markdown(f"**tokens/s:** {start['tokens_per_s']:,.0f} (run {start['run']}) -> {end['tokens_per_s']:,.0f} "
                    f"(run {end['run']})")
    widgets.table(tune["rows"], data.TUNE_HEADERS)
    if tune["tuned_yaml"]:
        st.caption("The tuned config, as `profile-run --config` takes it:")
        st.code(tune["tuned_yaml"], language="yaml")


runs_dir = data.runs_dir()
st.title("Recommend")
runs = data.records(runs_dir)
if widgets.no_runs(runs_dir, runs):
    st.stop()
verify_tab, sweeps_tab, tunes_tab = st.tabs(["Verify a run's recommendations", "Sweeps", "Tunes"])
with verify_tab:
    run_id = widgets.pick_run([r.id for r in runs if r.status not in ("corrupt", "unreadable")], label="Run", key="run")
    if run_id is None:
        st.info("Every run here is corrupt: none has recommendations to show.")
    else:
        _verify(run_id)
with sweeps_tab:
    _sweeps()
with tunes_tab:
    _tunes()
