"""Instruments on a real tiny training run: step rows, CPU sampler, trace window; plus the device module."""

from __future__ import annotations

import gzip
import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from profiler import store
from profiler.instruments import machine as devmod
from profiler.instruments.samplers import CpuBackend, Sampler, choose_backend
from profiler.instruments.step_timer import STEP_COLUMNS, StepTimer, _HwmReset
from profiler.instruments.torch_profiler import TraceWindow
from profiler.metrics import DERIVED_PHASES, PHASE_COLUMNS, PHASE_NAMES
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook, TrainStart
from reference_model.trainer import Trainer

BATCH, SEQ, STEPS = 4, 32, 4


class FakeWriter:
    """The store's writer protocol, in memory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.steps: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.ops: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def add_steps(self, rows: list[dict[str, Any]]) -> None:
        self.steps.extend(rows)

    def add_samples(self, rows: list[dict[str, Any]]) -> None:
        self.samples.extend(rows)

    def add_ops(self, rows: list[dict[str, Any]]) -> None:
        self.ops.extend(rows)

    def add_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def trace_path(self, rank: int) -> Path:
        return self.root / "traces" / f"rank{rank}.json.gz"


class Tee(FakeWriter):
    """Keeps the rows for the assertions and also hands them to the real store's writer."""

    def __init__(self, root: Path, real: store.RunWriter) -> None:
        super().__init__(root)
        self.real = real

    def add_steps(self, rows: list[dict[str, Any]]) -> None:
        super().add_steps(rows)
        self.real.add_steps(rows)

    def add_samples(self, rows: list[dict[str, Any]]) -> None:
        super().add_samples(rows)
        self.real.add_samples(rows)

    def add_ops(self, rows: list[dict[str, Any]]) -> None:
        super().add_ops(rows)
        self.real.add_ops(rows)

    def trace_path(self, rank: int) -> Path:
        return self.real.trace_path(rank)


def start(*, rank: int = 0, world_size: int = 1) -> TrainStart:
    return TrainStart(device=torch.device("cpu"), rank=rank, world_size=world_size, start_step=0, total_steps=2)


class Records(TrainerHook):
    def __init__(self, trace: TraceWindow) -> None:
        self.records: list[StepRecord] = []
        self.phases: set[str] = set()
        self.trace = trace
        self.exported: list[bool] = []
        """Per step: whether the window's trace was on disk when the step started."""

    def on_step_start(self, step: int) -> None:
        path = self.trace.summary()["trace_path"]
        self.exported.append(bool(path) and Path(path).is_file())

    def on_phase_start(self, step: int, phase: str) -> None:
        self.phases.add(phase)

    def on_step_end(self, record: StepRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One 4-step tiny run with every instrument: trace window wait=1, warmup=1, active=1."""
    root = tmp_path_factory.mktemp("run")
    real = store.RunWriter(root, flush_interval_s=0.2)
    writer = Tee(root, real)
    timer = StepTimer(writer)
    trace = TraceWindow(writer, wait=1, warmup=1, active=1)
    timer.profiled = trace.is_active
    backend, why = choose_backend("cpu")
    hz = 20.0
    sampler = Sampler(writer, backend, hz=hz, current_step=lambda: timer.current_step, reason=why)
    records = Records(trace)
    trainer = Trainer(model_cfg=model_config("tiny"), data_cfg=DataConfig(corpus=["synthetic"], seq_len=SEQ),
                      train_cfg=TrainConfig(batch_size=BATCH, steps=STEPS, device="cpu"),
                      hooks=[timer, sampler, trace, records], run_dir=root)
    trainer.fit()
    for hook in (timer, sampler, trace):
        hook.close()
    real.close()
    return SimpleNamespace(root=root, writer=writer, timer=timer, trace=trace, sampler=sampler, hz=hz,
                           records=records.records, phases=records.phases, exported=records.exported)


# -- StepTimer ------------------------------------------------------------------------------
def test_one_row_per_step_with_documented_columns(run: SimpleNamespace) -> None:
    rows = run.writer.steps
    assert [r["step"] for r in rows] == list(range(STEPS))
    for row in rows:
        assert list(row) == list(STEP_COLUMNS)
        assert row["rank"] == 0 and row["tokens"] == BATCH * SEQ and row["batch_size"] == BATCH
        assert row["micro_batches"] == 1 and not row["skipped"] and not row["warmup"]


def test_the_columns_are_the_vocabularys_phases(run: SimpleNamespace) -> None:
    assert [c for c in STEP_COLUMNS if c in PHASE_COLUMNS] == list(PHASE_COLUMNS)
    # every phase the trainer brackets is a timed phase of the vocabulary (checkpoint: only when saving)
    assert run.phases == set(PHASE_NAMES) - set(DERIVED_PHASES) - {"checkpoint"}


def test_phases_sum_to_step_time(run: SimpleNamespace) -> None:
    for row in run.writer.steps:
        phases = [row[c] for c in PHASE_COLUMNS]
        assert all(v >= 0 for v in phases)
        assert sum(phases) == pytest.approx(row["step_s"], rel=1e-6)
        assert row["forward_s"] > 0 and row["backward_s"] > 0 and row["optimizer_s"] > 0
        assert row["step_s"] == row["host_s"]  # CPU: one clock


def test_loss_grad_norm_lr_match_the_trainer(run: SimpleNamespace) -> None:
    for row, rec in zip(run.writer.steps, run.records, strict=True):
        assert row["loss"] == float(rec.loss)
        assert row["grad_norm"] == float(rec.grad_norm)
        assert row["lr"] == rec.lr


def test_memory_columns_on_cpu(run: SimpleNamespace) -> None:
    for row in run.writer.steps:
        assert math.isnan(row["mem_alloc_peak_bytes"]) and math.isnan(row["mem_reserved_peak_bytes"])
        assert row["rss_bytes"] > 10e6 and row["rss_peak_bytes"] > 10e6
        assert row["comm_calls"] == 0 and row["comm_bytes"] == 0  # one process communicates nothing


def _drive_step(timer: StepTimer, step: int, phases: dict[str, float | Callable[[], None]],
                loss: float = 1.0) -> None:
    """One step through the hooks without a trainer: each phase sleeps its seconds or runs its callable."""
    timer.on_step_start(step)
    for name, seconds in phases.items():
        timer.on_phase_start(step, name)
        if callable(seconds):
            seconds()
        else:
            time.sleep(seconds)
        timer.on_phase_end(step, name)
    timer.on_step_end(StepRecord(step=step, batch_size=2, micro_batches=1, tokens=16,
                                 loss=torch.tensor(loss), grad_norm=torch.tensor(0.5), lr=1e-3,
                                 loss_scale=None, skipped=False, wall_s=0.0))


def test_rss_peak_is_per_step_where_linux_allows(tmp_path: Path) -> None:
    if not _HwmReset().works:
        pytest.skip("/proc/self/clear_refs is not writable here: the peak is process-lifetime")
    writer = FakeWriter(tmp_path)
    timer = StepTimer(writer)
    timer.on_train_start(start())
    big = 200 * 2**20

    def spike() -> None:  # touch 200 MiB, then free it before the step ends
        block = bytearray(big)
        block[::4096] = b"x" * len(block[::4096])
        del block

    _drive_step(timer, 0, {"forward": spike})
    _drive_step(timer, 1, {"forward": 0.0})
    first, second = writer.steps
    assert timer.summary()["rss_peak_scope"] == "step"
    assert first["rss_peak_bytes"] - first["rss_bytes"] > 0.8 * big
    assert second["rss_peak_bytes"] < first["rss_peak_bytes"] - 0.8 * big  # the reset worked


class FakeEvent:
    """Stands in for torch.cuda.Event: times on the host clock, 'done' only when the test says so."""

    made: list[FakeEvent] = []

    def __init__(self) -> None:
        self.t = time.perf_counter()
        self.done = False
        FakeEvent.made.append(self)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1000.0


def test_cuda_path_resolves_lazily_in_order_and_carves_out_comm(tmp_path: Path, monkeypatch) -> None:
    writer = FakeWriter(tmp_path)
    comm = SimpleNamespace(take_step=lambda: {"calls": 3, "bytes": 4096, "time_s": 0.5, "exposed_s": 0.01,
                                              "bandwidth": 8192.0})
    timer = StepTimer(writer, comm=comm)
    timer.on_train_start(start(rank=1, world_size=2))
    timer.cuda = torch.device("cuda", 0)  # pretend: events instead of perf_counter
    FakeEvent.made = []
    monkeypatch.setattr(timer, "_record", FakeEvent)
    monkeypatch.setattr(timer, "_memory", lambda: (1.0, 2.0, 3.0, 4.0))
    _drive_step(timer, 0, {"data": 0.0, "forward": 0.002, "backward": 0.03, "optimizer": 0.001}, loss=2.0)
    assert writer.steps == []  # nothing read before the device is done
    for event in FakeEvent.made:
        event.done = True
    _drive_step(timer, 1, {"forward": 0.001, "backward": 0.005}, loss=3.0)
    assert [r["step"] for r in writer.steps] == [0]  # step 1 still pending
    timer.on_train_end(None, None)  # waits for the rest
    assert [r["step"] for r in writer.steps] == [0, 1]
    first, second = writer.steps
    assert first["rank"] == 1 and first["loss"] == 2.0 and second["loss"] == 3.0
    assert first["comm_s"] == 0.01 and first["comm_calls"] == 3 and first["comm_bytes"] == 4096
    assert first["backward_s"] >= 0.0199  # slept 30 ms, minus the 10 ms of exposed comm
    assert second["backward_s"] == 0.0 and 0.004 < second["comm_s"] < 0.01  # capped at its 5 ms backward
    for row in writer.steps:
        assert sum(row[c] for c in PHASE_COLUMNS) == pytest.approx(row["step_s"], rel=1e-6)
        assert row["mem_alloc_peak_bytes"] == 1.0 and row["rss_peak_bytes"] == 4.0


def test_a_broken_device_at_train_end_keeps_the_steps_already_done(tmp_path: Path, monkeypatch) -> None:
    writer = FakeWriter(tmp_path)
    timer = StepTimer(writer)
    timer.on_train_start(start())
    timer.cuda = torch.device("cuda", 0)
    FakeEvent.made = []
    monkeypatch.setattr(timer, "_record", FakeEvent)
    monkeypatch.setattr(timer, "_memory", lambda: (1.0, 2.0, 3.0, 4.0))
    _drive_step(timer, 0, {"forward": 0.0})
    _drive_step(timer, 1, {"forward": 0.0})

    def broken() -> None:
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(timer._pending[1].end, "synchronize", broken)
    timer.on_train_end(None, RuntimeError("the run failed"))
    assert [r["step"] for r in writer.steps] == [0]
    assert timer.summary()["unresolved_steps"] == 1


def test_several_ranks_without_comm_counters_is_not_measured(tmp_path: Path) -> None:
    writer = FakeWriter(tmp_path)
    timer = StepTimer(writer)
    timer.on_train_start(start(world_size=2))
    _drive_step(timer, 0, {"backward": 0.0})
    assert math.isnan(writer.steps[0]["comm_calls"]) and writer.steps[0]["comm_s"] == 0.0


# -- Sampler --------------------------------------------------------------------------------
def test_cpu_sampler_runs_at_its_rate_and_tags_steps(run: SimpleNamespace) -> None:
    samples = sorted(run.writer.samples, key=lambda r: r["ts"])
    span = samples[-1]["ts"] - samples[0]["ts"]
    expected = span * run.hz + 1
    assert 0.3 * expected <= len(samples) <= expected + 1  # never bursts to catch up; loose below (busy CI)
    assert {s["source"] for s in samples} == {"cpu"} and {s["rank"] for s in samples} == {0}
    steps = [s["step"] for s in samples]
    assert steps == sorted(steps) and set(steps) <= set(range(-1, STEPS))
    assert steps[-1] == STEPS - 1  # the last sample is taken at train end
    assert all(s["rss_bytes"] > 10e6 and s["cpu_process_pct"] >= 0 for s in samples)
    summary = run.sampler.summary()
    assert summary["samples"] == len(samples) and summary["read_errors"] == 0
    assert summary["reason"].startswith("no CUDA device")


def _wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_sampler_tags_rows_with_the_step_in_progress(tmp_path: Path) -> None:
    writer, current = FakeWriter(tmp_path), [7]
    backend = SimpleNamespace(source="fake", read=lambda: [{"device": 0, "x": 1.0}], close=lambda: None)
    sampler = Sampler(writer, backend, hz=100, rank=3, current_step=lambda: current[0])
    sampler.start()
    _wait_for(lambda: len(writer.samples) >= 2)
    current[0] = 8
    _wait_for(lambda: writer.samples[-1]["step"] == 8)
    sampler.close()
    steps = [s["step"] for s in writer.samples]
    assert steps[0] == 7 and steps[-1] == 8 and steps == sorted(steps)
    assert writer.samples[0]["rank"] == 3 and writer.samples[0]["x"] == 1.0


def test_a_failing_backend_never_stops_the_sampler(tmp_path: Path) -> None:
    calls = [0]

    def flaky() -> list[dict[str, Any]]:
        calls[0] += 1
        if calls[0] % 2:
            raise OSError("device went away for a moment")
        return [{"device": 0}]

    writer = FakeWriter(tmp_path)
    sampler = Sampler(writer, SimpleNamespace(source="flaky", read=flaky, close=lambda: None), hz=200)
    sampler.start()
    _wait_for(lambda: sampler.errors >= 3 and sampler.samples >= 3)
    sampler.close()
    summary = sampler.summary()
    assert summary["read_errors"] >= 3 and summary["samples"] >= 3
    assert "device went away" in summary["last_error"]
    assert not any(t.name.startswith("glmperf-sampler") for t in threading.enumerate())


def test_cpu_backend_counts_worker_processes(tmp_path: Path) -> None:
    import subprocess
    import sys

    backend = CpuBackend()
    child = subprocess.Popen([sys.executable, "-c", "import time; x = b'x' * 50_000_000; time.sleep(30)"])
    try:
        _wait_for(lambda: backend.read()[0]["rss_workers_bytes"] > 40e6, timeout=20)
        row = backend.read()[0]
    finally:
        child.kill()
        child.wait()
    assert row["workers"] >= 1 and row["rss_workers_bytes"] > 40e6


# -- TraceWindow ----------------------------------------------------------------------------
def test_trace_is_gzip_json_with_our_phase_annotations(run: SimpleNamespace) -> None:
    path = Path(run.trace.summary()["trace_path"])
    assert path.name.endswith(".json.gz")
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"glmperf/forward", "glmperf/backward", "glmperf/optimizer", "glmperf/step#2"} <= names
    assert "glmperf/step#3" not in names  # outside the window


def test_profiled_steps_are_flagged(run: SimpleNamespace) -> None:
    # wait=1, warmup=1, active=1: step 1 collects (warmup), step 2 is recorded, step 3 is after
    assert [r["profiled"] for r in run.writer.steps] == [False, True, True, False]
    summary = run.trace.summary()
    assert summary["recorded_steps"] == [2] and summary["trace_processing_s"] > 0


def test_the_window_is_exported_and_let_go_when_it_closes_not_at_the_end(run: SimpleNamespace) -> None:
    # kept to the end of training, its results spread over the heap and the steps after the window
    # page-fault into fresh memory (8.6% slower on `small`, benchmarks/own_loop_overhead)
    assert run.exported == [False, False, False, True]


def test_ops_rows_aggregate_the_recorded_step(run: SimpleNamespace) -> None:
    ops = run.writer.ops
    assert ops and all(r["name"] and r["calls"] > 0 and r["steps"] == 1 for r in ops)
    names = {r["name"] for r in ops}
    assert "glmperf/forward" in names and any(n.startswith("aten::") for n in names)
    mm = [r for r in ops if r["name"] in ("aten::mm", "aten::addmm", "aten::linear")]
    assert mm and all(r["input_shapes"].startswith("[[") for r in mm)
    assert sum(r["flops"] for r in ops) > 0


def test_rows_reach_the_real_store(run: SimpleNamespace) -> None:
    steps = store.read_table(run.root, "steps")
    assert list(steps["step"]) == list(range(STEPS)) and list(steps.columns) == [*STEP_COLUMNS, "attempt"]
    assert len(store.read_table(run.root, "samples")) == len(run.writer.samples)
    assert len(store.read_table(run.root, "ops")) == len(run.writer.ops)


# -- device ---------------------------------------------------------------------------------
def test_cpu_peak_flops_is_measured_once_then_cached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path))
    monkeypatch.setattr(devmod, "CONTENDED_CORES", float("inf"))  # treat this run as undisturbed
    flops, source = devmod.peak_flops("cpu", torch.float32, budget_s=0.1)
    assert flops > 1e8 and source.startswith("calibrated")
    again, source2 = devmod.peak_flops("cpu", torch.float32, budget_s=0.1)
    assert again == flops and "cached" in source2
    assert len(json.loads((tmp_path / "peak_flops.json").read_text())) == 1


def test_a_contended_calibration_is_redone_and_the_best_kept(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path))
    results = iter([{"flops": 5e9, "source": "busy", "contended": True},
                    {"flops": 3e9, "source": "quiet", "contended": False}])
    monkeypatch.setattr(devmod, "calibrate", lambda *a, **k: next(results))
    assert devmod.peak_flops("cpu", torch.bfloat16)[0] == 5e9
    assert devmod.peak_flops("cpu", torch.bfloat16)[0] == 5e9  # re-measured (3e9), best kept, now settled
    flops, source = devmod.peak_flops("cpu", torch.bfloat16)  # no third calibration: next() would raise
    assert flops == 5e9 and "cached" in source


def test_gpu_peak_table() -> None:
    assert devmod.table_peak("NVIDIA H100 80GB HBM3", torch.bfloat16)[0] == 989e12
    assert devmod.table_peak("NVIDIA H100 PCIe", torch.bfloat16)[0] == 756e12
    assert devmod.table_peak("NVIDIA H200", torch.bfloat16)[0] == 989e12
    assert devmod.table_peak("NVIDIA A100-SXM4-80GB", torch.float32)[0] == (
        19.5e12 if torch.get_float32_matmul_precision() == "highest" else 156e12)
    assert devmod.table_peak("NVIDIA A10", torch.bfloat16)[0] == 125e12
    assert devmod.table_peak("Tesla V100-SXM2-16GB", torch.float16)[0] == 125e12
    assert devmod.table_peak("Tesla V100-SXM2-16GB", torch.bfloat16) is None  # no bf16 tensor cores: measure
    assert devmod.table_peak("NVIDIA A10G", torch.bfloat16) is None  # not in the table: measure, never guess


@pytest.mark.parametrize(("amp", "kind"), [("off", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")])
def test_each_precision_is_measured_against_its_own_peak(tmp_path: Path, monkeypatch, amp: str, kind: str) -> None:
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path))
    peak = devmod.run_peak("cpu", amp)
    assert peak["dtype"] == kind and f" {kind} matmuls" in peak["source"] and peak["flops"] > 0
    assert list(json.loads((tmp_path / "peak_flops.json").read_text())) == [f"cpu|{devmod.cpu_model()}|threads="
                                                                           f"{torch.get_num_threads()}|torch="
                                                                           f"{torch.__version__}|{kind}"]


def test_environment_on_cpu() -> None:
    env = devmod.environment("cpu", world_size=4)
    assert env["device"] == "cpu" and env["device_name"] == devmod.cpu_model() and env["cpu_threads"] >= 1
    assert env["torch"] == torch.__version__ and env["world_size"] == 4 and "rank" not in env
    assert env["nvml"] == {"available": False, "reason": "no CUDA device: the run's device is cpu"}


def test_attention_is_timed_with_its_backward() -> None:
    """Attention's backward is no operator of its own in the table, and in low precision it can cost
    many times its fp32 self: both timed calls must run it."""
    shapes = ((2, 4, 16, 8), (2, 2, 16, 8), (2, 2, 16, 8))  # grouped-query: 4 query heads, 2 KV heads
    for call in devmod._work("sdpa", shapes, torch.bfloat16, torch.device("cpu")):
        grads = call()
        assert [tuple(g.shape) for g in grads] == list(shapes)
