"""Serving a rank's live metrics while it trains (profile.metrics_port; docs/monitoring.md).

The labels and the peak MFU divides by come from run.json, which exists before any rank starts;
the model's FLOPs per token arrive when the rank has built it (`RankRecord.update`).
"""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

import torch

from profiler import store
from profiler.instruments.prometheus import Figures, MetricsServer, check_ports, local_rank
from profiler.settings import ProfileConfig


def check_metrics_ports(profile: ProfileConfig, ranks_here: int, first: int = 0) -> None:
    """Before a run starts: the ports its local ranks `first`.. will serve on are valid and free."""
    if profile.metrics_port:
        check_ports(profile.metrics_host, profile.metrics_port, ranks_here, first)


def serve(run_dir: Path, profile: ProfileConfig, *, rank: int, world_size: int,
          device: torch.device) -> MetricsServer | None:
    """This rank's metrics server, or None when the run serves none."""
    if not profile.metrics_port:
        return None
    record = store.read_run(run_dir)
    labels = {"run_id": str(record.get("id", run_dir.name)), "run_name": str(record.get("name", "")),
              "rank": str(rank), "host": socket.gethostname()}
    info = {"source": str(record.get("source") or "profile-run"), "device": str(device),
            "world_size": str(world_size)}
    figures = Figures(labels, info)
    peak = (record.get("peak") or {}).get("flops")
    figures.peak_flops = float(peak) if isinstance(peak, int | float) else math.nan
    return MetricsServer(figures, host=profile.metrics_host, port=profile.metrics_port + local_rank(rank))


def model_flops(fields: dict[str, Any]) -> float | None:
    """FLOPs per token among a rank's recorded facts: the reference model's, or a user's model record."""
    value = fields.get("flops_per_token")
    if value is None and isinstance(fields.get("model"), dict):
        value = fields["model"].get("flops_per_token")
    return float(value) if isinstance(value, int | float) else None
