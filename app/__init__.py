"""The Streamlit dashboard (the dashboard issue builds it): a router, cached loaders, thin pages.

It shows runs side by side with the figures of `reports` and the data of `profiler`; nothing
imports it.
"""
