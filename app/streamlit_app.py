"""The dashboard's entrypoint: it only routes (st.navigation); each page is a file in app_pages/.

    glmperf dashboard [--runs-dir DIR] [--port P]     # or: GLMPERF_RUNS=DIR streamlit run app/streamlit_app.py

A page that fails shows one line and no traceback (a traceback names the server's files); the
server's log has the details.
"""

from __future__ import annotations

import logging

import streamlit as st

FAILED = "This page could not be shown; the dashboard's log says why."

st.set_option("client.showErrorDetails", "none")  # an error outside a page's script shows no details either
st.set_page_config(page_title="glmperf", layout="wide")
page = st.navigation([
    st.Page("app_pages/runs.py", title="Runs", url_path="runs", default=True),
    st.Page("app_pages/run.py", title="Run", url_path="run"),
    st.Page("app_pages/compare.py", title="Compare", url_path="compare"),
    st.Page("app_pages/recommend.py", title="Recommend", url_path="recommend"),
])
try:
    page.run()
except Exception:  # st.stop and st.rerun are no Exception: they pass through
    logging.getLogger("glmperf.dashboard").exception("page %s failed", page.title)
    st.error(FAILED)
