"""Orchestrates one profiled run: run directory, ranks, instruments, status, summary.

`profile_run` is the whole life of a run. With one process everything happens here; with
`nproc > 1` this process creates the run, launches the ranks with torchrun (each rank runs
`python -m profiler.run --run-dir DIR` and writes only its own files), waits, and finalizes. A rank
that fails fails the run with that rank named; SIGINT/SIGTERM leave the run `interrupted`; a crash
leaves it `failed` with the error, also when it is the launcher's own. Either way every step
flushed before it stays readable.

The device is resolved once per process (`resolve_device` of train.device) and handed down: to
the environment record, the peak the MFU divides by, the setup context and the instruments.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from optimizers.config import ConfigError
from profiler import store
from profiler.capture.finish import finalize, measured_peaks
from profiler.capture.launch import launch_ranks
from profiler.capture.live_metrics import check_metrics_ports
from profiler.capture.ranks import run_rank
from profiler.config import RunConfig, preset_changes
from profiler.instruments.machine import environment
from reference_model.context import resolve_device
from reference_model.hooks import TrainerHook


def create_run_dir(cfg: RunConfig, *, runs_dir: Path | None, nproc: int, launcher: bool = True,
                   links: dict[str, Any] | None = None, device: torch.device | None = None) -> Path:
    """The run directory with run.json (`running`, the resolved config, this machine's environment).

    `preset_changes` are stored now, while the config's code is loaded, so that a report or the
    dashboard reads them without importing torch. With `launcher`, the peak MFU divides by is measured
    now, before any rank starts, so even a run killed midway has its MFU. `launcher=False` when ranks
    are started elsewhere (`glmperf init-run`): no process of ours watches the run, so liveness is
    judged by the ranks' heartbeats alone, and the peak is measured at finalize. `links` are run.json
    fields that tie the run to what it was made for (`verifies`, `sweep`, `tune`). `device`: the
    run's, when the caller has resolved it already.
    """
    device = device if device is not None else resolve_device(cfg.train.device)
    config = json.loads(json.dumps(cfg.to_dict(), default=str))  # as run.json will hold it
    record: dict[str, Any] = {"config": config, "world_size": nproc,
                              "environment": environment(device, world_size=nproc), **(links or {})}
    with contextlib.suppress(ConfigError):  # readers compute them later, as for a run stored without them
        record["preset_changes"] = preset_changes(config, nproc)
    if launcher:
        record.update(measured_peaks(device, cfg.switches.amp.dtype))
    else:
        record["pid"] = None
    return store.create_run(store.default_runs_dir(runs_dir), cfg.name, record)


def profile_run(cfg: RunConfig, *, runs_dir: Path | None = None, nproc: int = 1, progress: bool = True,
                hooks: Sequence[TrainerHook] = (), links: dict[str, Any] | None = None) -> Path:
    """Run and measure `cfg`; returns the run directory (its run.json says how it ended).

    `hooks` are extra trainer hooks for a single-process run (your own callbacks). A failure of a
    rank is that rank's record; a failure of this process (the launcher) is the run's `error`.
    `links` go into run.json as they are (create_run_dir).
    """
    if hooks and nproc > 1:
        raise ValueError("extra hooks run in-process; with nproc > 1 the ranks are separate processes")
    check_metrics_ports(cfg.profile, nproc)
    device = resolve_device(cfg.train.device)
    run_dir = create_run_dir(cfg, runs_dir=runs_dir, nproc=nproc, links=links, device=device)
    launcher_error = None
    try:
        if nproc == 1:
            run_rank(run_dir, cfg, device=device, progress=progress, extra_hooks=hooks)
        else:
            launcher_error = launch_ranks(run_dir, nproc, progress=progress)
    except KeyboardInterrupt:
        pass  # the ranks recorded `interrupted`; the run says so
    except Exception as exc:
        if nproc > 1:  # rank 0 in this process recorded its own failure; this one is the launcher's
            launcher_error = f"{type(exc).__name__}: {exc}"
    finally:
        _finish(run_dir, launcher_error)
    return run_dir


class Unfinished(Exception):
    """The run trained but its end did not complete (Ctrl-C, a full disk): every flushed row is on disk
    and `glmperf finalize` finishes it."""

    def __init__(self, run_dir: Path, why: str, *, interrupted: bool) -> None:
        super().__init__(f"run {run_dir.name} was not finalized ({why}): its measured steps are kept; "
                         f"glmperf finalize {run_dir.name} finishes it")
        self.run_dir, self.interrupted = run_dir, interrupted


def _finish(run_dir: Path, launcher_error: str | None) -> None:
    try:
        finalize(run_dir, launcher_error=launcher_error)
    except KeyboardInterrupt:
        raise Unfinished(run_dir, "interrupted while finishing", interrupted=True) from None
    except store.StoreError as exc:
        raise Unfinished(run_dir, str(exc), interrupted=False) from None
    except OSError as exc:
        raise Unfinished(run_dir, str(store.disk_error(exc, "finishing", exc.filename or run_dir)),
                         interrupted=False) from None

