"""What-if probes: a candidate change measured on the run's own model, shapes and device, in seconds.

A probe builds the run's config and the changed config as two reference trainers in this process (the
run's model, batch, sequence length, loader and threads) and drives them one optimizer step each in
turn, in ABBA order, so a machine that gets busier slows both sides alike. Each step is timed by the
run's own step timer, phase by phase (CUDA events on a GPU, read after each step), so a probe measures
what a run measures. The first WARMUP steps of each side are set apart: their excess over a steady
step is the change's one-off cost (torch.compile's compile time), reported, never mixed into the step.
Rounds are added until the step-time ratio's interval is narrower than RELATIVE_WIDTH (or the machine's
run-to-run spread, when wider: profiler.advice.spread), MAX_ROUNDS are done, or the probe's time is spent.

A probe keeps, per round, each side's time per token in every phase, and, when the change is about
memory, what each side holds across a step: on CUDA the allocator's step peak; on the CPU, which has no
allocator peak to read, the bytes autograd saves for backward in one forward (profiler.advice.
saved_tensors) plus the parameters, gradients and optimizer state. profiler.advice.measured turns
it into an expected gain through the run's own breakdown.

What decides a probe is the run's config (less its name, step count and profiling), the change, this
machine (device, its name, ISA flags, threads) and torch's version; probes are kept under that key in
$GLMPERF_CACHE/probes, so asking again is instant.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from profiler.config import RunConfig, load_config
from profiler.instruments.machine import cache_dir, cpu_flags, device_name
from profiler.metrics import PHASE_NAMES
from profiler.settings import override_texts
from profiler.store.files import StoreError, write_json_atomic
from reference_model.context import resolve_device

WARMUP = 1
"""Steps of each side set apart before the rounds: compile, allocator growth, the loader's first batch. A
later step that still pays some of it is one round of several, and rounds are judged by their median."""
MIN_ROUNDS = 3
"""Fewest rounds: enough for a median; more are added only while the interval is wider than the range a
user can expect anyway (the machine's run-to-run spread), so a probe on a noisy machine costs little."""
MAX_ROUNDS = 16
RELATIVE_WIDTH = 0.06
"""Stop adding rounds once the step-time ratio's 90% interval is this narrow, relative to the ratio."""
STEPS = 10_000
"""Each side's configured step count: the baseline is shared by every change probed, and its loader and
schedule must not run out."""
UNDECIDED = ("name", "train.steps", "train.log_every", "profile", "switches.checkpoint.dir",
             "switches.checkpoint.resume")
"""Config keys that do not change what a step costs: left out of a probe's key."""
VERSION = 1
"""Of a cached probe's layout: a cached probe of another version is measured again."""


class ProbeError(ValueError):
    """The change cannot be probed here (one line: why)."""


@dataclass
class Probe:
    """One change measured against the unchanged config, side by side."""

    change: dict[str, Any]
    base: list[dict[str, float]] = field(default_factory=list)
    """Per round: the unchanged config's seconds per token in each phase (phase name -> s)."""
    cand: list[dict[str, float]] = field(default_factory=list)
    """Per round: the changed config's, in the same round."""
    memory: dict[str, float] | None = None
    """{"base": bytes, "cand": bytes} held across a step (see the module docstring), when measured."""
    memory_kind: str = ""
    """What `memory` counts: "allocator peak" (CUDA) or "saved activations + parameters, gradients and
    optimizer state" (CPU)."""
    one_off_s: float = 0.0
    """The changed side's warmup time beyond steady steps, less the baseline's: compile time."""
    cost_s: float = 0.0
    """Wall time the probe took, building both trainers included."""
    machine: str = ""
    threads: int = 0
    measured: str = ""
    """When (UTC)."""
    stopped: str = ""
    """Why no more rounds were added."""
    version: int = VERSION

    @property
    def rounds(self) -> int:
        return len(self.cand)

    def step_ratios(self) -> list[float]:
        """Per round: the changed config's time per token over the baseline's."""
        return [sum(c.values()) / sum(b.values()) for b, c in zip(self.base, self.cand, strict=True)
                if sum(b.values()) > 0]


def probe_key(config: Mapping[str, Any], change: Mapping[str, Any], threads: int) -> str:
    """What decides a probe, hashed: the config less what does not change a step's cost, the change,
    this machine and torch's version."""
    import torch

    flat = _decided(config)
    device = resolve_device(str(flat.get("train.device", "auto")))
    decided = {"config": flat, "change": dict(change), "device": device.type, "device_name": device_name(device),
               "cpu_flags": cpu_flags(), "threads": threads, "torch": torch.__version__, "version": VERSION}
    return hashlib.sha256(json.dumps(decided, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _decided(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if path in UNDECIDED:
            continue
        if isinstance(value, Mapping):
            out.update(_decided(value, f"{path}."))
        else:
            out[path] = value
    return out


def cached(key: str) -> Probe | None:
    """The probe kept under `key`, or None (missing, unreadable or of another layout)."""
    try:
        data = json.loads((cache_dir() / "probes" / f"{key}.json").read_text(encoding="utf-8"))
        probe = Probe(**data)
    except (OSError, ValueError, TypeError):
        return None
    return probe if probe.version == VERSION and probe.rounds >= MIN_ROUNDS else None


def keep(key: str, probe: Probe) -> None:
    """Cache `probe` (atomically); an unwritable cache only costs a new probe next time."""
    path = cache_dir() / "probes" / f"{key}.json"
    with contextlib.suppress(OSError, StoreError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, asdict(probe))


class _Rows:
    """The step timer's writer: the rows, kept in memory."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add_steps(self, rows: list[dict[str, Any]]) -> None:
        self.rows.extend(rows)


class _Side:
    """One config as a live trainer, driven one step at a time, each step timed by the run's step timer."""

    def __init__(self, cfg: RunConfig, workdir: Path, threads: int) -> None:
        # here: reading cached probes needs neither the trainer nor torch
        from profiler.instruments.step_timer import StepTimer
        from reference_model.trainer import Trainer

        self.threads = cfg.switches.threads.count or threads
        """torch's threads for this side's steps: its config's, else the run's (the threads switch's change)."""

        self.rows = _Rows()
        self.timer = StepTimer(self.rows)
        self.trainer = Trainer(model_cfg=cfg.model, data_cfg=cfg.data, train_cfg=cfg.train, switches=cfg.switches,
                               hooks=[self.timer], run_dir=workdir)
        self.cuda = self.trainer.device.type == "cuda"
        self.timer.on_train_start(self.trainer.train_start())
        self.batches = iter(self.trainer.loader)
        self.step_no = 0

    def step(self) -> dict[str, Any]:
        """One optimizer step; its row (phase seconds, tokens, the allocator's step peak on CUDA)."""
        import torch

        torch.set_num_threads(self.threads)  # the other side may run on another count
        self.trainer.run_step(self.step_no, self.batches)
        self.step_no += 1
        if self.cuda:
            torch.cuda.synchronize(self.trainer.device)
            self.timer.flush()
        return self.rows.rows[-1]

    def held_bytes(self) -> float:
        """CPU: the bytes one forward saves for backward plus the parameters, gradients and optimizer
        state (no allocator peak to read); CUDA: the steady steps' median allocator peak."""
        import torch

        if self.cuda:
            peaks = [r["mem_alloc_peak_bytes"] for r in self.rows.rows[WARMUP:]]
            return statistics.median(peaks) if peaks else math.nan
        from profiler.advice.saved_tensors import saved_bytes

        setup, data = self.trainer.setup, self.trainer.data_cfg
        ids = torch.randint(0, 256, (self.trainer.train_cfg.batch_size, data.seq_len))
        return float(saved_bytes(setup.raw_model, ids, setup.autocast_dtype) + sum(self.trainer.held_bytes().values()))

    def close(self) -> None:
        self.timer.close()
        del self.batches


def per_token(row: Mapping[str, Any]) -> dict[str, float]:
    """A step row's seconds per token in each phase."""
    tokens = max(float(row["tokens"]), 1.0)
    return {name: float(row[f"{name}_s"]) / tokens for name in PHASE_NAMES}


def interval_width(ratios: list[float]) -> float:
    """The 90% interval of the median ratio (order statistics), relative to the median."""
    ordered = sorted(ratios)
    n = len(ordered)
    half = 1.645 * math.sqrt(n) / 2
    lo, hi = ordered[max(0, int(n / 2 - half))], ordered[min(n - 1, math.ceil(n / 2 + half))]
    return (hi - lo) / statistics.median(ordered)


class Prober:
    """Probes changes of one run's config on this machine; the baseline trainer is built once, on first
    use, and shared by every change probed."""

    def __init__(self, config: Mapping[str, Any], *, device: str, threads: int | None = None,
                 workdir: Path | None = None) -> None:
        import torch

        self.config = {**config, "train": {**config["train"], "device": torch.device(device).type}}
        self.threads = threads or torch.get_num_threads()
        self._tmp = tempfile.TemporaryDirectory(prefix="glmperf-probe-", dir=workdir)
        self.workdir = Path(self._tmp.name)
        self._base: _Side | None = None

    def key(self, change: Mapping[str, Any]) -> str:
        return probe_key(self.config, change, self.threads)

    def _config(self, change: Mapping[str, Any], label: str) -> RunConfig:
        overrides = [*override_texts(change), f"train.steps={STEPS}", f"name=probe-{label}",
                     f"switches.checkpoint.dir={self.workdir / label / 'checkpoints'}",
                     "switches.checkpoint.resume=false"]
        try:
            return load_config(base=self.config, overrides=overrides, nproc=1)
        except ValueError as exc:
            raise ProbeError(f"cannot run here in one process: {exc}") from None

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def measure(self, change: Mapping[str, Any], *, budget_s: float, memory: bool = False,
                width: float = RELATIVE_WIDTH) -> Probe:
        """Probe `change` against the run's config within about `budget_s` seconds (warmup and two
        trainers' building included; MIN_ROUNDS are always done), until the step ratio's 90% interval is
        narrower than `width` (relative): no narrower than what a fresh run would blur it by."""
        started = time.perf_counter()
        cand_cfg = self._config(change, "cand")
        with self._threads():
            if self._base is None:
                self._base = _Side(self._config({}, "base"), self.workdir / "base", self.threads)
                for _ in range(WARMUP):
                    self._base.step()
            base = self._base
            cand = _Side(cand_cfg, self.workdir / "cand", self.threads)
            try:
                return self._rounds(change, base, cand, started, budget_s, memory, width)
            finally:
                cand.close()

    def _rounds(self, change: Mapping[str, Any], base: _Side, cand: _Side, started: float, budget_s: float,
                memory: bool, width: float) -> Probe:
        probe = Probe(change=dict(change), threads=self.threads, machine=device_name(cand.trainer.device))
        warm = [cand.step()["step_s"] for _ in range(WARMUP)]
        stopped = f"{MAX_ROUNDS} rounds"
        for i in range(MAX_ROUNDS):
            pair = (base, cand) if i % 2 == 0 else (cand, base)
            rows = {id(side): side.step() for side in pair}
            probe.base.append(per_token(rows[id(base)]))
            probe.cand.append(per_token(rows[id(cand)]))
            if probe.rounds < MIN_ROUNDS:
                continue
            if interval_width(probe.step_ratios()) < width:
                stopped = f"the step ratio's 90% interval is within {width:.0%}"
                break
            spent = time.perf_counter() - started
            if spent + spent / (WARMUP + i + 1) > budget_s:  # another round would overrun
                stopped = "the probe's time was spent"
                break
        steady = statistics.median(float(r["step_s"]) for r in cand.rows.rows[WARMUP:])
        base_steady = statistics.median(float(r["step_s"]) for r in base.rows.rows[WARMUP:])
        base_warm = [float(r["step_s"]) for r in base.rows.rows[:WARMUP]]
        probe.one_off_s = max(0.0, sum(warm) - WARMUP * steady - max(0.0, sum(base_warm) - WARMUP * base_steady))
        if memory:
            probe.memory = {"base": base.held_bytes(), "cand": cand.held_bytes()}
            probe.memory_kind = "allocator peak" if cand.cuda else \
                "saved activations + parameters, gradients and optimizer state"
        probe.stopped = stopped
        probe.cost_s = time.perf_counter() - started
        probe.measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        return probe

    def close(self) -> None:
        if self._base is not None:
            self._base.close()
            self._base = None
        self._tmp.cleanup()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
