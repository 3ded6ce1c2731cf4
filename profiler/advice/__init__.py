"""Advice on a stored run: what holds it back (diagnose), which switches to flip (recommend), and what a
layout holds per rank before it runs (plan, for `glmperf plan`)."""
