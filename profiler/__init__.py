"""glmperf's run: measured, stored, analyzed, advised, compared.

What users import is `profiler.api` (measure your own training loop) and `profiler.integrations`
(Hugging Face and Lightning callbacks); the command line is `profiler.cli`. Inside, the wings follow
the order a run lives, each importing only its own wing or lower ones (tests/test_house.py): the
ground floor (settings, config, store, metrics, text, plugins), instruments, traces, analysis,
advice, compare, capture, experiments, and on top the CLI and the API. Nothing is imported here, so
that reading a stored run costs only what it uses.
"""
