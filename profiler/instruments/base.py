"""The instrument base: a trainer hook that can also summarize itself and release what it holds.

Every method passes through, so an instrument overrides only the hooks it needs (Lightning's
`profilers/profiler.py` shape). Instruments write their rows to the run store's writer; they keep
nothing heavy for `summary()`, which the analysis does not need (it reads the stored rows).
"""

from __future__ import annotations

from typing import Any

from reference_model.trainer import TrainerHook


class Instrument(TrainerHook):
    """A `TrainerHook` with a small `summary()` for run.json and a `close()` for threads and files."""

    def summary(self) -> dict[str, Any]:
        """Facts about the instrument itself (what it measured with, errors); {} by default."""
        return {}

    def close(self) -> None:
        """Release threads, files or profiler state; safe to call twice, and after a failed run."""
