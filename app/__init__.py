"""The Streamlit dashboard (`glmperf dashboard`): a router, cached loaders, thin pages.

It shows runs side by side with the figures of `reports` and the data of `profiler`; nothing
imports it.
"""
