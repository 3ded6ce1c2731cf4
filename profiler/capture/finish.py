"""The end of every run, whatever made it (profile-run, `glmperf finalize`, the API, `glmperf import`):
the ranks' files merged, its status decided, its summary, trace figures and diagnosis stored in run.json,
which is written once, with all of it.

The run is read once (`load_run`, after the ranks' files are merged) and that record is completed in
memory: the summary, the precision speedup at the run's shapes and the diagnosis are all readings of
the same files. What differs by source is small: a profile-run's rank 0 reports the model's facts and
the switches it applied, an API run's rank 0 the user's model; an import brings its own trace summary
and nothing ran here to fail, sample or time again.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler import store
from profiler.advice.advise import advise
from profiler.analysis import RunData, load_run, summarize
from profiler.analysis.operators import precision_work
from profiler.config import RunConfig, build_run_config
from profiler.instruments.machine import matmul_dtype, matmul_peaks, matmul_speedup, run_peak
from profiler.traces.summary import trace_summary
from reference_model.context import resolve_device

if TYPE_CHECKING:
    import torch

MODEL_FACTS = ("num_params", "flops_per_token", "attention_flops_per_token")
"""run.json `model` of a profile-run run: what its rank 0 counted of the model it built."""


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


def finalize(run_dir: Path, *, launcher_error: str | None = None,
             trace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Merge the ranks' files, decide the run's status and store it with the summary and diagnosis;
    returns run.json as written.

    `launcher_error`: what the process that waited on the ranks saw go wrong. `trace`: an imported
    run's `summary.trace`, from the traces it was made of. Should reading the run fail, run.json still
    gets the status and whatever was computed before the error, which is raised. Stopped by Ctrl-C at any
    point, or by a full disk while compacting (a StoreError naming the file), run.json is left as it was,
    `running`, with every flushed row readable: finalizing again finishes the job.
    """
    statuses = {s["rank"]: s for s in store.read_rank_statuses(run_dir)}
    store.remove_stale_temps(run_dir)
    events_skipped = store.compact(run_dir)
    run = load_run(run_dir)
    record = run.record
    status, error = ("completed", None) if run.source == "import" else \
        _outcome(run.world_size, statuses, launcher_error)  # an import's traces ran elsewhere: they ended
    record.update(status=status, error=error, ended=store.utc_now(), ranks=list(statuses.values()))
    if run.attempts:
        record["attempts"] = run.attempts
    if events_skipped:
        record["events_skipped"] = events_skipped
    run.ranks = record["ranks"]
    try:
        cfg = None if run.source == "import" else _rank_facts(run, statuses.get(0, {}))
        summary = summarize(run)
        record["summary"] = summary if trace is None else {**summary, "trace": trace}
        _readings(run, summary, cfg)
    except Exception:
        store.write_json_atomic(run_dir / "run.json", record)
        raise
    store.write_json_atomic(run_dir / "run.json", record)
    return record


def _rank_facts(run: RunData, rank0: dict[str, Any]) -> RunConfig | None:
    """Into the record: how the ranks sampled, the peak when no launcher measured it, and the model as rank 0
    saw it (profile-run: its facts and the switches applied; api: the user's model). Returns the run's
    config when the peak needed it built."""
    record, cfg = run.record, None
    record["sampling"] = rank0.get("sampling")
    if not record.get("peak"):  # ranks started elsewhere (init-run): measured here, now
        cfg = build_run_config(record["config"])
        record.update(measured_peaks(resolve_device(cfg.train.device), cfg.switches.amp.dtype))
    if run.source == "profile-run":
        record.update(model={key: rank0.get(key) for key in MODEL_FACTS},
                      switches_applied=rank0.get("applied", []), setup_notes=rank0.get("notes", []))
    else:  # a user's own model (profiler.api): what its rank recorded, and no switches to speak of
        record["model"] = rank0.get("model") or record.get("model")
    return cfg


def _readings(run: RunData, summary: dict[str, Any], cfg: RunConfig | None) -> None:
    """Into the record: the precision speedup at the run's shapes and the traces' figures (for a run that ran
    here), then the diagnosis. Advice is a reading of what was measured: it never costs the run its record, a
    failure is the diagnosis' `error`."""
    record = run.record
    try:
        if run.source != "import":
            device = run_device(run, cfg)
            record["shape_speedup"] = shape_speedup(run, device)
            # the GPU's idle, overlap and launch figures as import reads them, and every rank's collectives
            if (device.type == "cuda" or run.world_size > 1) and (traced := trace_summary(run.path)):
                record["summary"] = {**summary, "trace": traced}
        diagnosis = advise(run)
    except Exception as exc:
        diagnosis = {"error": f"{type(exc).__name__}: {exc}"}
    record["diagnosis"] = diagnosis


def await_ranks(run_dir: Path, world_size: int, wait_s: float) -> str | None:
    """Wait for every rank's outcome; what is wrong when some never gave one within `wait_s` (the launcher
    error to finalize with, where no launcher watched the ranks: the API's rank 0)."""
    deadline = time.monotonic() + wait_s
    while True:
        ended = {s["rank"] for s in store.read_rank_statuses(run_dir) if s.get("status") != "running"}
        missing = [r for r in range(world_size) if r not in ended]
        if not missing:
            return None
        if time.monotonic() > deadline:
            return (f"rank(s) {', '.join(map(str, missing))} gave no outcome within {wait_s:g} s of rank 0's end; "
                    "the run was finalized without it")
        time.sleep(0.1)


def shape_speedup(run: RunData, device: torch.device) -> dict[str, float]:
    """The low-precision dtypes' speedup over fp32 at the run's own heaviest matmul and attention shapes, measured
    now on this machine (the run's is still warm): what switching precision would give this model."""
    work = precision_work(run)
    if not work:
        return {}
    kinds = ("bf16", "fp16") if device.type == "cuda" else ("bf16",)
    return {kind: matmul_speedup(device, work, matmul_dtype(kind)) for kind in kinds}


def run_device(run: RunData, cfg: RunConfig | None = None) -> torch.device:
    """The device a stored run trained on: its config's for profile-run (`cfg` when built already), the
    recorded one otherwise."""
    if run.source == "profile-run":
        return resolve_device((cfg or build_run_config(run.config)).train.device)
    import torch  # here, not at the top: an import finishes its run without torch

    return torch.device(run.device)


def measured_peaks(device: torch.device, amp: str) -> dict[str, Any]:
    """run.json `peak` (the device's peak in the run's matmul dtype) and `matmul_peaks` (every dtype's)."""
    return {"peak": run_peak(device, amp), "matmul_peaks": matmul_peaks(device)}
