"""The dashboard's pages: each a thin script that st.navigation runs (app/streamlit_app.py)."""
