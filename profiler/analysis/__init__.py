"""Analysis of stored runs: parse once (`load_run`), then pure functions over the loaded run.

    run = load_run("runs/<id>")      # any stored run: completed, failed, interrupted, live or killed
    summary_of(run)                   # the stored summary, or one computed from the flushed steps

Analysis never prints or renders: the CLI, the reports and the dashboard do.
"""

from __future__ import annotations

from typing import Any

from profiler.analysis.loader import RunData, load_run
from profiler.analysis.summary import summarize

__all__ = ["RunData", "load_run", "summarize", "summary_of"]


def summary_of(run: RunData) -> dict[str, Any]:
    """The run's summary: as stored once it ended, else computed now from what was flushed."""
    if run.ended and run.record.get("summary") is not None:
        return run.record["summary"]
    return summarize(run)
