"""The dashboard's entrypoint: it only routes (st.navigation); each page is a file in app_pages/.

    glmperf dashboard [--runs-dir DIR] [--port P]     # or: GLMPERF_RUNS=DIR streamlit run app/streamlit_app.py
"""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="glmperf", layout="wide")
st.navigation([
    st.Page("app_pages/runs.py", title="Runs", url_path="runs", default=True),
    st.Page("app_pages/run.py", title="Run", url_path="run"),
    st.Page("app_pages/compare.py", title="Compare", url_path="compare"),
    st.Page("app_pages/recommend.py", title="Recommend", url_path="recommend"),
]).run()
