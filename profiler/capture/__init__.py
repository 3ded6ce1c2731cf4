"""Making a run: profile-run's ranks (run, ranks, launch), `glmperf import` of existing traces
(import_traces), and the one ending every run goes through (finish)."""
