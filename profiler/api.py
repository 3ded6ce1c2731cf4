"""Profile your own training loop: the same instruments, run format and analysis as `profile-run`.

    from profiler import api

    with api.run(name="my-model", runs_dir="runs", config={"lr": 3e-4}, model=model) as run:
        for batch in loader:
            with run.step(tokens=batch["input_ids"].numel()) as step:
                with run.phase("forward"):
                    loss = model(**batch).loss
                with run.phase("backward"):
                    loss.backward()
                with run.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                step.loss = loss.detach()

`api.run` creates a run directory (status `running`), starts the step timer, the sampler and the
torch.profiler window of `profile.trace_window` exactly as profile-run does (profiler.capture.ranks.instruments),
and on leaving the block closes them and finalizes the run: summary, diagnosis, report.html,
`completed`; `failed` with the error on an exception and `interrupted` on Ctrl-C or SIGTERM, every
step before it kept.

Phases are the vocabulary's (data, h2d, forward, backward, optimizer, checkpoint); any other name
is accepted, shown in the trace window as `glmperf/<name>` and counted in the step's `other` time.
On CUDA every boundary records an event that is read lazily, as for the reference trainer: timing
never synchronizes the device. The loss you hand over is copied to the host without a sync too.

`run.probe(model, loss_of, tokens=...)` after the last step measures the advice's autocast change on
your model and one batch's loss (the callbacks call it at the train end); rank 0 alone probes, so under
DDP give it the module inside (`model.module`), whose backward waits on no other rank.

MFU needs FLOPs per token: `flops_per_token` when given, else 6N from `model`'s parameter count
(PaLM appendix B without its attention term, which needs the model's shape), else none: the run
says which in run.json `model.flops_source` and its summary notes.

Under torchrun every rank enters `api.run` with the same arguments and writes its own part of one
run; rank 0 creates the directory (and tells the others through torch.distributed when it is
initialized, else through a file named by torchrun's run id) and, when its block ends, waits for
the other ranks' outcomes and finalizes the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# kineto logs every profiler start and stop unless told not to (read when the profiler first starts)
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import torch

from optimizers.config import build_section, section_to_dict
from profiler import plugins, store
from profiler.capture.finish import await_ranks, finalize, measured_peaks
from profiler.capture.live_metrics import check_metrics_ports
from profiler.capture.ranks import RankRecord, instruments, raise_interrupted
from profiler.capture.user_model import count_allreduces, model_record
from profiler.instruments.machine import MATMUL_DTYPES, environment
from profiler.instruments.prometheus import local_rank
from profiler.settings import ProfileConfig
from reference_model.context import dist_env
from reference_model.hooks import StepRecord, TrainStart

SOURCE = "api"
"""run.json `source` of runs made here (readers take a run without one for a profile-run run)."""
OPTIONS = ("name", "runs_dir", "config", "model", "flops_per_token", "profile", "device", "amp", "rank_wait_s")
"""The keywords `api.run` and the framework callbacks take."""
NAN = float("nan")
log = logging.getLogger("glmperf.api")


class UsageError(RuntimeError):
    """The loop used the run in a way it cannot measure (a step inside a step, a phase outside one)."""


def check_options(options: Mapping[str, Any]) -> None:
    """A TypeError naming each unknown keyword and the allowed ones (the callbacks take the same)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown keyword(s) {', '.join(unknown)}; allowed: {', '.join(OPTIONS)}")


@dataclass
class Step:
    """The step in progress: set `loss` (a tensor or a float) and, if not given to `step()`, `tokens`."""

    index: int
    tokens: int | None = None
    """Input tokens this rank processed in the step (for tokens/s and MFU)."""
    loss: Any = None
    batch_size: int = 0
    """Samples in the step's batch (0: not given)."""
    lr: float = NAN
    micro_batches: int = 1


def _device_of(model: torch.nn.Module | None, device: str | torch.device | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if model is not None:
        param = next(iter(model.parameters()), None)
        if param is not None:
            return param.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


_opened = 0
"""Runs this process has opened: every rank opens the same sequence, so the n-th names one run."""


def _shared_run_dir(create: Callable[[], Path], rank: int, world_size: int, runs_dir: Path, wait_s: float) -> Path:
    """Rank 0 creates the run; the others learn its directory from torch.distributed or, before the
    process group exists, from a file torchrun's run id names (a shared filesystem, as the runs need)."""
    if world_size == 1:
        return create()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        box: list[str | None] = [str(create()) if rank == 0 else None]
        torch.distributed.broadcast_object_list(box, src=0)
        assert box[0] is not None  # rank 0's directory, broadcast to every rank
        return Path(box[0])
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        raise UsageError(f"rank {rank} of {world_size} cannot find the run's other ranks: initialize "
                         "torch.distributed before api.run, or start the ranks with torchrun")
    key = f"{run_id}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}-{_opened}"
    pointer = runs_dir / ".api-ranks" / f"{''.join(c if c.isalnum() or c in '-_' else '-' for c in key)}.json"
    if rank == 0:
        run_dir = create()
        pointer.parent.mkdir(parents=True, exist_ok=True)
        store.write_json_atomic(pointer, {"run_dir": str(run_dir)})
        return run_dir
    deadline = time.monotonic() + wait_s
    while not pointer.exists():
        if time.monotonic() > deadline:
            raise UsageError(f"rank {rank}: rank 0 created no run within {wait_s:g} s ({pointer} is missing)")
        time.sleep(0.05)
    return Path(json.loads(pointer.read_text(encoding="utf-8"))["run_dir"])


class Run:
    """One measured run of a user's own loop; `api.run(...)` makes one. A context manager, or, for
    callbacks, `start()` ... `end(error)`; steps and phases likewise by `with` or by begin/end."""

    def __init__(self, *, name: str = "run", runs_dir: str | Path | None = None,
                 config: Mapping[str, Any] | None = None, model: torch.nn.Module | None = None,
                 flops_per_token: float | None = None, profile: Mapping[str, Any] | ProfileConfig | None = None,
                 device: str | torch.device | None = None, amp: str = "off", rank_wait_s: float = 120.0) -> None:
        if amp not in MATMUL_DTYPES:
            raise ValueError(f"amp: got {amp!r}; allowed: {', '.join(MATMUL_DTYPES)} (the matmul dtype of the "
                             "loop, which the peak behind MFU is measured in)")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"config: got {type(config).__name__}; allowed: a mapping of your settings")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: got {type(model).__name__}; allowed: a torch.nn.Module (or None)")
        self.name, self.model, self.amp, self.rank_wait_s = str(name), model, amp, float(rank_wait_s)
        self.runs_dir = store.default_runs_dir(runs_dir)
        self.user_config = json.loads(json.dumps(dict(config or {}), default=str))
        self.profile: ProfileConfig = build_section(ProfileConfig, profile, "profile")
        self.flops_per_token = flops_per_token
        self.device = _device_of(model, device)
        self.rank, self.world_size = dist_env()
        compiled = isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
        self.framework: dict[str, Any] = {"name": "torch", "settings": {"autocast": amp, "compile": compiled}}
        """run.json config.framework: what trains the loop, the settings the advice checks (callbacks set theirs)."""
        self.dir: Path | None = None
        self.status: str | None = None
        self._record: RankRecord | None = None
        self._hooks: list[Any] = []
        self._step: Step | None = None
        self._phase: str | None = None
        self._t0 = 0.0
        self._next = 0
        self._previous_sigterm: Any = None

    # -- the run ----------------------------------------------------------------------------
    def start(self) -> Run:
        """Create (or, on ranks > 0, join) the run and start the instruments."""
        global _opened
        if self._record is not None:
            raise UsageError("the run is already started; start() once, then end()")
        store.check_runs_dir(self.runs_dir)
        check_metrics_ports(self.profile, local_rank(self.rank) + 1, first=local_rank(self.rank))
        self.dir = _shared_run_dir(self._create, self.rank, self.world_size, self.runs_dir, self.rank_wait_s)
        _opened += 1
        self._record = RankRecord(self.dir, rank=self.rank, flush_interval_s=self.profile.flush_interval_s,
                                  world_size=self.world_size)
        compiled = isinstance(self.model, torch._dynamo.eval_frame.OptimizedModule)
        comm, comm_note = count_allreduces(self.model, self.device, self.world_size)
        self._record.serve_metrics(self.profile, self.device)
        self._hooks, sampling = instruments(self.profile, self._record.sink, device=self.device, rank=self.rank,
                                            comm=comm, compiled=compiled)
        self._record.hooks = self._hooks
        self._record.update(sampling=sampling, model=model_record(self.model, self.flops_per_token),
                            torch_threads=torch.get_num_threads(), loader_workers=0, comm=comm_note)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, raise_interrupted)
        self._call("on_train_start", TrainStart(device=self.device, rank=self.rank, world_size=self.world_size,
                                                start_step=0, total_steps=0))
        return self

    def end(self, error: BaseException | None = None) -> str:
        """Stop measuring; on rank 0 also finalize the run (after the other ranks' outcomes). Returns the
        run's status on rank 0, this rank's elsewhere."""
        if self._record is None:
            raise UsageError("the run was never started: use `with api.run(...)` or call start() first")
        if self._phase is not None:
            self.end_phase(self._phase)
        self._step = None
        with contextlib.suppress(Exception):  # an instrument failing at the end must not hide the outcome
            self._call("on_train_end", None, error)
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        record, self._record = self._record, None
        self.status = record.close(error)
        assert self.dir is not None
        if self.rank == 0:
            missing = await_ranks(self.dir, self.world_size, self.rank_wait_s) if self.world_size > 1 else None
            self.status = finalize(self.dir, launcher_error=missing)["status"]
            for command, outcome in plugins.after_run(self.dir):  # the HTML report, as profile-run writes it
                if not isinstance(outcome, Path):
                    log.warning("%s: %s", command, outcome)
        return self.status

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.end(exc)

    @property
    def summary(self) -> dict[str, Any]:
        """run.json `summary` once the run ended (rank 0), else {}."""
        if self.dir is None or self._record is not None:
            return {}
        return store.read_run(self.dir).get("summary") or {}

    def probe(self, model: torch.nn.Module, loss_of: Callable[[], torch.Tensor], *, tokens: int) -> None:
        """Inside the run, after the last step: measure the advice's autocast change on `model` and `loss_of`
        (a batch's loss: a forward; `tokens` its input tokens), so its range is measured on your model
        (profiler.capture.own_probe; the callbacks call it at the train end). A probe that fails costs only
        its measurement: the range stays modelled, and run.json `own_probes_error` says why."""
        from profiler.capture.own_probe import probe_own  # the probes' imports: only where one runs

        if self.rank != 0 or self.dir is None or self._record is None:
            return
        try:
            probes = probe_own(model, loss_of, tokens=tokens, device=next(model.parameters()).device, amp=self.amp,
                               budget_s=self.profile.probe_budget_s)
        except Exception as exc:  # the user's model, under a change: the training itself already ended well
            store.update_run(self.dir, own_probes_error=f"{type(exc).__name__}: {exc}")
            return
        if probes:
            store.update_run(self.dir, own_probes=[asdict(p) for p in probes])

    # -- steps and phases -------------------------------------------------------------------
    def begin_step(self, *, tokens: int | None = None, batch_size: int = 0) -> Step:
        if self._record is None:
            raise UsageError("run.step() outside the run: open steps inside `with api.run(...) as run:`")
        if self._step is not None:
            raise UsageError(f"run.step() inside step {self._step.index}: steps follow one another, "
                             "they do not nest (end the current one first)")
        self._step = Step(index=self._next, tokens=tokens, batch_size=batch_size)
        self._call("on_step_start", self._step.index)
        self._t0 = time.perf_counter()
        return self._step

    def end_step(self) -> None:
        step = self._require_step("end_step()")
        if self._phase is not None:
            raise UsageError(f"step {step.index} ended inside phase {self._phase!r}: end the phase first")
        if step.tokens is None:
            self.abandon_step()
            raise UsageError(f"step {step.index} has no token count, so it was not recorded: pass "
                             "run.step(tokens=N) or set step.tokens (input tokens this rank processed in the step)")
        loss = step.loss.detach() if isinstance(step.loss, torch.Tensor) else \
            torch.tensor(NAN if step.loss is None else float(step.loss))
        record = StepRecord(step=step.index, batch_size=int(step.batch_size), micro_batches=int(step.micro_batches),
                            tokens=int(step.tokens), loss=loss, grad_norm=torch.tensor(NAN), lr=float(step.lr),
                            loss_scale=None, skipped=False, wall_s=time.perf_counter() - self._t0)
        self._step = None
        self._next += 1
        self._call("on_step_end", record)

    def abandon_step(self) -> None:
        """Drop the step in progress unrecorded (it raised): the steps before it are what was measured."""
        if self._phase is not None:
            self.end_phase(self._phase)
        self._step = None

    def begin_phase(self, name: str) -> None:
        step = self._require_step(f"run.phase({name!r})")
        if self._phase is not None:
            raise UsageError(f"phase {name!r} opened inside phase {self._phase!r} of step {step.index}: phases "
                             "follow one another inside a step (end the current one first)")
        self._phase = str(name)
        self._call("on_phase_start", step.index, self._phase)

    def end_phase(self, name: str) -> None:
        step = self._require_step(f"ending phase {name!r}")
        if self._phase != name:
            raise UsageError(f"phase {name!r} ended but the open phase is {self._phase!r}")
        self._phase = None
        self._call("on_phase_end", step.index, name)

    def switch_phase(self, name: str | None) -> None:
        """End the open phase, if any, and begin `name` (None: no phase): for callbacks, whose events
        mark where the next part of a step starts rather than where the last one ended."""
        if self._phase is not None:
            self.end_phase(self._phase)
        if name is not None:
            self.begin_phase(name)

    @property
    def current_step(self) -> Step | None:
        """The step in progress (None between steps)."""
        return self._step

    @contextlib.contextmanager
    def step(self, *, tokens: int | None = None, batch_size: int = 0) -> Iterator[Step]:
        """One optimizer step of the loop; the block's time is the step time."""
        step = self.begin_step(tokens=tokens, batch_size=batch_size)
        try:
            yield step
        except BaseException:
            self.abandon_step()
            raise
        self.end_step()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A part of the step: data, h2d, forward, backward, optimizer, checkpoint, or a name of yours."""
        self.begin_phase(name)
        try:
            yield
        finally:
            if self._phase == name:
                self.end_phase(name)

    # -- internals --------------------------------------------------------------------------
    def _require_step(self, what: str) -> Step:
        if self._step is None:
            raise UsageError(f"{what} outside a step: phases belong inside `with run.step(tokens=...)`")
        return self._step

    def _call(self, name: str, *args: Any) -> None:
        for hook in self._hooks:
            getattr(hook, name)(*args)

    def _create(self) -> Path:
        record = {"source": SOURCE, "world_size": self.world_size,
                  "config": {"name": self.name, "profile": section_to_dict(self.profile), "user": self.user_config,
                             "framework": json.loads(json.dumps(self.framework, default=str))},
                  "model": model_record(self.model, self.flops_per_token),
                  "environment": environment(self.device, world_size=self.world_size),
                  **measured_peaks(self.device, self.amp)}
        if self.world_size > 1:
            record["pid"] = None  # no one process watches the ranks: liveness is their heartbeats
        return store.create_run(self.runs_dir, self.name, record)


def run(**options: Any) -> Run:
    """A run of your own loop (see the module docstring); keywords: OPTIONS."""
    check_options(options)
    return Run(**options)
