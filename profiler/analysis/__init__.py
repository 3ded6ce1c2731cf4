"""Analysis of stored runs: parse once (`load_run`), then pure functions over the loaded run.

    run = load_run("runs/<id>")      # any stored run: completed, failed, interrupted, live or killed
    summary_of(run)                   # the stored summary, or one computed from the flushed steps
    analyze(run)                      # every analyzer's figures: {name: Figure(value, unit, source)}
    run.warmup_steps, run.on_cuda     # run.json through typed accessors, one default each (RunRecord)
    run.steady_steps                  # the steps the summary counts, computed once per loaded run

What the reports and the dashboard draw beside the figures comes from here too: `top_operators`,
`collectives_by_rank`, `capacity`, `grad_norm_outliers`.

Analysis never prints or renders: the CLI, the reports and the dashboard do.
"""

from __future__ import annotations

from typing import Any

from profiler.analysis import breakdown, comm, environment, gpu_trace, input_pipeline, memory, operators, stability
from profiler.analysis.comm import collectives_by_rank
from profiler.analysis.environment import HARMLESS_REASONS
from profiler.analysis.figures import Figure, Figures, stored
from profiler.analysis.loader import RunData, load_run
from profiler.analysis.memory import capacity
from profiler.analysis.operators import top_operators
from profiler.analysis.record import RunRecord
from profiler.analysis.stability import OUTLIER_FACTOR, grad_norm_outliers
from profiler.analysis.summary import summarize

__all__ = ["HARMLESS_REASONS", "OUTLIER_FACTOR", "Figure", "Figures", "RunData", "RunRecord", "analyze", "capacity",
           "collectives_by_rank", "grad_norm_outliers", "load_run", "stored", "summarize", "summary_of",
           "top_operators"]

ANALYZERS = (breakdown, memory, comm, input_pipeline, operators, stability, environment, gpu_trace)
"""One module per concern, each `analyze(run, summary) -> Figures` (pure, documented in its docstring); gpu_trace
comes after operators: the traces' GPU busy time replaces the operators' estimate."""


def summary_of(run: RunData) -> dict[str, Any]:
    """The run's summary: as stored once it ended, else computed now from what was flushed."""
    if run.ended and run.stored_summary is not None:
        return run.stored_summary
    return summarize(run)


def analyze(run: RunData) -> Figures:
    """Every analyzer's figures for `run`, by name (names are unique across analyzers)."""
    summary = summary_of(run)
    figures: Figures = {}
    for analyzer in ANALYZERS:
        figures.update(analyzer.analyze(run, summary))
    return figures
