"""Runs side by side: the statistics of two sets of repeats (stats), the pass/fail gate (gate), a comparison
of stored runs (runs), its output formats (formats) and what changed between their traces (trace_diff)."""
