"""Across ranks: stragglers, and how unevenly the ranks wait in communication.

- `stragglers`: the ranks whose median step is more than STRAGGLER_OVER (5%) longer than the median
  of the ranks' medians, slowest first, each with `rank`, `median_step_s`, `over_median` (x).
- `comm_wait`: each rank's communication kernel time per step (`per_rank_s`), and `imbalance`,
  (max - min) / max. In a collective the ranks that arrive early wait for the last one inside the
  NCCL kernel, so the fast ranks show the most communication time: a high imbalance says the time
  is lost to waiting for a slower rank, not to the network.
Both need two ranks or more ({} otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

STRAGGLER_OVER = 1.05


def analyze(steps: pd.DataFrame, per_rank: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not steps.empty and steps["rank"].nunique() >= 2:
        medians = steps.groupby("rank")["step_s"].median()
        typical = float(medians.median())
        slow = medians[medians > STRAGGLER_OVER * typical].sort_values(ascending=False)
        out["stragglers"] = [{"rank": int(r), "median_step_s": float(s), "over_median": float(s / typical)}
                             for r, s in zip(slow.index, slow, strict=True)]
    comm = {r: f["comm_time_s"] / f["window_steps"] for r, f in per_rank.items()
            if f.get("comm_time_s") and f.get("window_steps")}
    if len(comm) >= 2:
        high, low = max(comm.values()), min(comm.values())
        out["comm_wait"] = {"per_rank_s": {str(r): v for r, v in sorted(comm.items())},
                            "imbalance": (high - low) / high if high > 0 else 0.0}
    return out
