"""Figures and self-contained HTML reports of stored runs.

Figures are pure functions here (data frame in, plotly figure out), shared by the HTML report and
the dashboard; this package reads runs through `profiler` and never measures anything itself.
"""
