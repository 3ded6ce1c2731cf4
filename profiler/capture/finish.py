"""The end of a run: the ranks' files merged, its status decided, its summary, trace figures and diagnosis
stored in run.json.

The device is resolved once per process (`resolve_device` of train.device) and handed down: to
the environment record and the peak the MFU divides by.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from profiler import store
from profiler.advice.recommend import advise
from profiler.analysis import RunData, load_run, summarize
from profiler.analysis.operators import precision_work
from profiler.config import build_run_config
from profiler.instruments.machine import MATMUL_DTYPES, matmul_peaks, matmul_speedup, run_peak
from profiler.traces.summary import trace_summary
from reference_model.context import resolve_device


def _outcome(world_size: int, statuses: dict[int, dict[str, Any]], launcher_error: str | None
             ) -> tuple[str, str | None]:
    """The run's status and error from the ranks' records and what the launcher saw."""
    if not statuses and launcher_error:
        return "failed", f"the launch failed before any rank started: {launcher_error}"
    ended = {r: s for r, s in statuses.items() if s.get("status") != "running"}
    failed = [r for r in range(world_size) if ended.get(r, {}).get("status") == "failed"]
    silent = [r for r in range(world_size) if r not in ended]
    if silent and launcher_error:  # a rank killed outright is the root cause; others fail after it
        named = re.match(r"rank (\d+)", launcher_error)  # torchrun's report names the first failure
        root = int(named.group(1)) if named and int(named.group(1)) in silent else silent[0]
        error = f"rank {root} failed: it died without reporting a status ({launcher_error})"
        if failed:
            error += f"; then rank {failed[0]} failed: {ended[failed[0]].get('error')}"
        return "failed", error
    if failed:
        return "failed", f"rank {failed[0]} failed: {ended[failed[0]].get('error')}"
    if launcher_error:  # ranks it stopped say `interrupted`, but the launch is what failed
        return "failed", f"the launch failed: {launcher_error}"
    if any(s.get("status") == "interrupted" for s in ended.values()):
        return "interrupted", next(s.get("error") for s in ended.values() if s.get("error"))
    if silent:
        return "failed", f"rank {silent[0]} failed: it ended without reporting a status"
    return "completed", None


def finalize(run_dir: Path, *, launcher_error: str | None = None) -> dict[str, Any]:
    """Merge the ranks' files, decide the run's status, write the summary into run.json."""
    record = store.read_run(run_dir)
    world_size = int(record["world_size"])
    statuses = {s["rank"]: s for s in store.read_rank_statuses(run_dir)}
    store.compact(run_dir)
    status, error = _outcome(world_size, statuses, launcher_error)
    rank0 = statuses.get(0, {})
    fields: dict[str, Any] = {}
    if not record.get("peak"):  # ranks started elsewhere (init-run): measured here, now
        cfg = build_run_config(record["config"])
        fields.update(measured_peaks(resolve_device(cfg.train.device), cfg.switches.amp.dtype))
    if record.get("source", "profile-run") == "profile-run":
        fields.update(model={key: rank0.get(key) for key in ("num_params", "flops_per_token",
                                                             "attention_flops_per_token")},
                      switches_applied=rank0.get("applied", []), setup_notes=rank0.get("notes", []))
    else:  # a user's own model (profiler.api): what its rank recorded, and no switches to speak of
        fields["model"] = rank0.get("model") or record.get("model")
    store.update_run(
        run_dir, status=status, error=error, ended=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        ranks=list(statuses.values()), sampling=rank0.get("sampling"), **fields)
    run = load_run(run_dir)
    summary = summarize(run)
    store.update_run(run_dir, summary=summary)
    try:  # advice is a reading of what was measured: it must never cost the run its record
        store.update_run(run_dir, shape_speedup=shape_speedup(run))
        # the GPU's idle, overlap and launch figures as import reads them, and every rank's collectives
        if (run_device(run.record).type == "cuda" or run.world_size > 1) and (traced := trace_summary(run_dir)):
            store.update_run(run_dir, summary={**summary, "trace": traced})
        diagnosis = advise(load_run(run_dir))
    except Exception as exc:
        diagnosis = {"error": f"{type(exc).__name__}: {exc}"}
    return store.update_run(run_dir, diagnosis=diagnosis)


def shape_speedup(run: RunData) -> dict[str, float]:
    """The low-precision dtypes' speedup over fp32 at the run's own heaviest matmul and attention shapes, measured
    now on this machine (the run's is still warm): what switching precision would give this model."""
    work = precision_work(run)
    if not work:
        return {}
    device = run_device(run.record)
    kinds = ("bf16", "fp16") if device.type == "cuda" else ("bf16",)
    return {kind: matmul_speedup(device, work, MATMUL_DTYPES[kind]) for kind in kinds}


def run_device(record: dict[str, Any]) -> torch.device:
    """The device a stored run trained on: its config's for profile-run, the recorded one otherwise."""
    if record.get("source", "profile-run") == "profile-run":
        return resolve_device(build_run_config(record["config"]).train.device)
    return torch.device((record.get("environment") or {}).get("device", "cpu"))


def measured_peaks(device: torch.device, amp: str) -> dict[str, Any]:
    """run.json `peak` (the device's peak in the run's matmul dtype) and `matmul_peaks` (every dtype's)."""
    return {"peak": run_peak(device, amp), "matmul_peaks": matmul_peaks(device)}
