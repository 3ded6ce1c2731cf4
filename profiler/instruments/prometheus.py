"""Live metrics of a running job in Prometheus' exposition format (docs/monitoring.md).

Why this shape: a cluster already runs Prometheus, so a job is one more scrape target. The
training thread pays nothing beyond what the instruments already do: `MetricsTap` stands in front
of the run writer and keeps a reference to the last step row, the last sample per device and a
few counts as rows go by; the figures are built in the HTTP server's thread when Prometheus
scrapes (`Figures.collect`). Nothing is served before the job starts or after it ends: the server
closes with the rank, and a job that dies takes it along.

Names follow Prometheus' conventions (`glmperf_*`, the unit in the name, counters end in
`_total`); every series carries `run_id`, `run_name`, `rank` and `host`. Rank r serves on
`profile.metrics_port` + its local rank, so ranks sharing a host do not collide.
"""

from __future__ import annotations

import errno
import math
import os
import socket
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from optimizers.config import ConfigError

LABELS = ("run_id", "run_name", "rank", "host")
"""The labels of every series: which job, which rank, where."""
PHASES = ("data", "h2d", "forward", "backward", "comm", "optimizer", "checkpoint", "other")
STABILITY_KINDS = ("non_finite", "loss_spike", "loss_plateau", "rollback")
NAN = float("nan")


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str  # "gauge" or "counter" (the name without its `_total`)
    help: str
    labels: tuple[str, ...] = ()


SPECS = (
    Spec("glmperf_run_info", "gauge", "1 for each rank of a running job, with what it runs on", ("source", "device",
                                                                                                   "world_size")),
    Spec("glmperf_steps", "counter", "Optimizer steps finished"),
    Spec("glmperf_last_step", "gauge", "Index of the last finished optimizer step"),
    Spec("glmperf_step_seconds", "gauge", "The last step's time"),
    Spec("glmperf_step_phase_seconds", "gauge", "The last step's time in each phase (they sum to the step)",
         ("phase",)),
    Spec("glmperf_data_wait_ratio", "gauge", "Share of the last step spent waiting for the next batch"),
    Spec("glmperf_tokens_per_second", "gauge", "This rank's input tokens per second over the last step"),
    Spec("glmperf_mfu_ratio", "gauge", "Model FLOPs utilization of this rank's last step against one device's peak "
                                       "(NaN when the peak or the model's FLOPs are unknown)"),
    Spec("glmperf_loss", "gauge", "The last step's training loss"),
    Spec("glmperf_grad_norm", "gauge", "The last step's global gradient L2 norm before clipping"),
    Spec("glmperf_learning_rate", "gauge", "The learning rate the last step used"),
    Spec("glmperf_loss_non_finite", "gauge", "1 when the last step's loss or gradient norm was NaN or Inf"),
    Spec("glmperf_skipped_steps", "counter", "Updates skipped (NaN guard, fp16 overflow, rollback)"),
    Spec("glmperf_stability_events", "counter", "Stability events by kind", ("kind",)),
    Spec("glmperf_memory_peak_bytes", "gauge", "Device memory allocated at the last step's peak (NaN on CPU)"),
    Spec("glmperf_rss_bytes", "gauge", "Resident memory of the training process"),
    Spec("glmperf_comm_seconds", "gauge", "Time in collectives of the last step, overlapped or not", ("collective",)),
    Spec("glmperf_comm_exposed_seconds", "gauge", "The last step's communication not hidden behind compute"),
    Spec("glmperf_collective_latency_seconds", "gauge", "Mean time of one collective call in the last step",
         ("collective",)),
    Spec("glmperf_gpu_utilization_ratio", "gauge", "Share of time a kernel ran on the GPU (NVML)", ("device",)),
    Spec("glmperf_gpu_sm_clock_hertz", "gauge", "GPU SM clock (NVML)", ("device",)),
    Spec("glmperf_gpu_power_watts", "gauge", "GPU power draw (NVML)", ("device",)),
    Spec("glmperf_gpu_temperature_celsius", "gauge", "GPU temperature (NVML)", ("device",)),
    Spec("glmperf_gpu_memory_used_bytes", "gauge", "GPU memory used, all processes (NVML)", ("device",)),
    Spec("glmperf_cpu_process_utilization_ratio", "gauge", "Cores the training process and its workers kept busy "
                                                           "(can exceed 1)"),
    Spec("glmperf_cpu_system_utilization_ratio", "gauge", "Share of the machine's cores busy"),
)
METRIC_NAMES = tuple(s.name + ("_total" if s.kind == "counter" else "") for s in SPECS)
"""Every series name served (what alert rules and dashboards may use)."""
_SPEC = {s.name: s for s in SPECS}
_GPU = {"glmperf_gpu_utilization_ratio": ("gpu_util_pct", 0.01), "glmperf_gpu_sm_clock_hertz": ("sm_clock_mhz", 1e6),
        "glmperf_gpu_power_watts": ("power_w", 1.0), "glmperf_gpu_temperature_celsius": ("temperature_c", 1.0),
        "glmperf_gpu_memory_used_bytes": ("mem_used_bytes", 1.0)}


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return NAN


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 and math.isfinite(whole) else NAN


class Figures:
    """What the instruments have seen so far, kept by reference; built into metric families on scrape."""

    def __init__(self, labels: Mapping[str, str], info: Mapping[str, str]) -> None:
        self.labels, self.info = dict(labels), dict(info)
        self.flops_per_token = NAN
        self.peak_flops = NAN
        self.last: dict[str, Any] | None = None
        self.samples: dict[int, dict[str, Any]] = {}
        self.steps = self.skipped = 0
        self.measured = dict.fromkeys(("loss", "grad_norm"), info.get("source") == "profile-run")
        """Whether the loop measures a value at all: your own loop may give no loss, and never gives a
        grad norm; until one is finite, its NaN means "not measured", not a divergence."""
        self.events: Counter[str] = Counter()
        self._lock = threading.Lock()  # the sampler's thread and the training thread both add

    # -- fed by the tap, on the instruments' threads: references and counts only ------------------
    def add_steps(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self.last = rows[-1]
            for key, seen in self.measured.items():
                self.measured[key] = seen or any(math.isfinite(_num(r.get(key))) for r in rows)
            self.steps += len(rows)
            self.skipped += sum(bool(r.get("skipped")) for r in rows)

    def add_samples(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            for row in rows:
                self.samples[int(_num(row.get("device", -1)))] = row

    def add_event(self, event: Mapping[str, Any]) -> None:
        if event.get("kind") in STABILITY_KINDS:
            with self._lock:
                self.events[str(event["kind"])] += 1

    # -- built on scrape, in the server's thread -------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            last, samples = self.last, dict(self.samples)
            steps, skipped, events = self.steps, self.skipped, dict(self.events)
        values: dict[str, list[tuple[tuple[str, ...], float]]] = {s.name: [] for s in SPECS}
        values["glmperf_run_info"].append((tuple(self.info[k] for k in _SPEC["glmperf_run_info"].labels), 1.0))
        values["glmperf_steps"].append(((), float(steps)))
        values["glmperf_skipped_steps"].append(((), float(skipped)))
        values["glmperf_stability_events"] += [((kind,), float(events.get(kind, 0))) for kind in STABILITY_KINDS]
        if last is not None:
            self._step_values(last, values)
        for device, row in sorted(samples.items()):
            self._sample_values(device, row, values)
        for spec in SPECS:
            if values[spec.name]:
                yield self._family(spec, values[spec.name])

    def _step_values(self, row: Mapping[str, Any], values: dict[str, list]) -> None:
        step_s, tokens = _num(row.get("step_s")), _num(row.get("tokens"))
        loss, grad_norm = _num(row.get("loss")), _num(row.get("grad_norm"))
        calls, comm_s = _num(row.get("comm_calls")), _num(row.get("comm_time_s"))
        tokens_per_s = _ratio(tokens, step_s)
        plain = {
            "glmperf_last_step": _num(row.get("step")), "glmperf_step_seconds": step_s,
            "glmperf_data_wait_ratio": _ratio(_num(row.get("data_s")), step_s),
            "glmperf_tokens_per_second": tokens_per_s,
            "glmperf_mfu_ratio": _ratio(tokens_per_s * self.flops_per_token, self.peak_flops),
            "glmperf_loss": loss, "glmperf_grad_norm": grad_norm, "glmperf_learning_rate": _num(row.get("lr")),
            "glmperf_loss_non_finite": float(any(self.measured[k] and not math.isfinite(x)
                                                 for k, x in (("loss", loss), ("grad_norm", grad_norm)))),
            "glmperf_memory_peak_bytes": _num(row.get("mem_alloc_peak_bytes")),
            "glmperf_rss_bytes": _num(row.get("rss_bytes")),
            "glmperf_comm_exposed_seconds": _num(row.get("comm_s")),
        }
        for name, value in plain.items():
            values[name].append(((), value))
        values["glmperf_step_phase_seconds"] += [((p,), _num(row.get(f"{p}_s"))) for p in PHASES]
        if calls > 0:  # the comm counters see DDP's gradient buckets: all-reduces
            values["glmperf_comm_seconds"].append((("all_reduce",), comm_s))
            values["glmperf_collective_latency_seconds"].append((("all_reduce",), comm_s / calls))

    @staticmethod
    def _sample_values(device: int, row: Mapping[str, Any], values: dict[str, list]) -> None:
        if device < 0:  # the host
            values["glmperf_cpu_process_utilization_ratio"].append(
                ((), (_num(row.get("cpu_process_pct")) + _num(row.get("cpu_workers_pct"))) / 100))
            values["glmperf_cpu_system_utilization_ratio"].append(((), _num(row.get("cpu_system_pct")) / 100))
            return
        for name, (column, scale) in _GPU.items():
            values[name].append(((str(device),), _num(row.get(column)) * scale))

    def _family(self, spec: Spec, values: list[tuple[tuple[str, ...], float]]) -> Metric:
        family_cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
        family = family_cls(spec.name, spec.help, labels=(*LABELS, *spec.labels))
        base = tuple(self.labels[k] for k in LABELS)
        for extra, value in values:
            family.add_metric((*base, *extra), value)
        return family


class MetricsTap:
    """The run writer with the live figures taking a look as rows go by; everything else passes through."""

    def __init__(self, writer: Any, figures: Figures) -> None:
        self._writer, self._figures = writer, figures

    def add_steps(self, rows: list[dict[str, Any]]) -> None:
        self._writer.add_steps(rows)
        if rows:
            self._figures.add_steps(rows)

    def add_samples(self, rows: list[dict[str, Any]]) -> None:
        self._writer.add_samples(rows)
        if rows:
            self._figures.add_samples(rows)

    def add_event(self, event: dict[str, Any]) -> None:
        self._writer.add_event(event)
        self._figures.add_event(event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


class PortError(ConfigError):
    """A metrics port this job cannot serve on; the message is one line, said before training."""


def local_rank(rank: int) -> int:
    """The rank's index on its host (torchrun's LOCAL_RANK), which offsets its port."""
    return int(os.environ.get("LOCAL_RANK", rank))


def check_ports(host: str, port: int, count: int, first: int = 0) -> None:
    """Refuse, before any training, ports out of range or already taken on this host: those of local
    ranks `first` to `count - 1` (a process checks its own; a launcher all of its ranks')."""
    if not 1 <= port <= 65535 - (count - 1):
        raise PortError("profile.metrics_port", f"got {port}; allowed: 1..{65535 - (count - 1)} (ranks on one host "
                        f"serve on the port + their local rank, {count} here), or 0 to serve none")
    for p in range(port + first, port + count):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server will bind
            try:
                probe.bind((host, p))
            except OSError as exc:
                raise _bind_error(host, p, exc) from None


def _bind_error(host: str, port: int, exc: OSError) -> PortError:
    if exc.errno == errno.EADDRINUSE:
        return PortError("profile.metrics_port", f"port {port} is in use on {host}; allowed: a free port (ranks "
                         "serve on the port + their local rank), or 0 to serve none")
    return PortError("profile.metrics_host", f"cannot serve on {host}:{port} ({exc.strerror or exc}); allowed: an "
                     "address of this host")


class MetricsServer:
    """One rank's HTTP endpoint for Prometheus, serving `figures` until `close()`."""

    def __init__(self, figures: Figures, *, host: str, port: int) -> None:
        self.figures, self.host, self.port = figures, host, port
        registry = CollectorRegistry(auto_describe=False)
        registry.register(figures)  # a Collector by shape: collect()
        try:
            server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise _bind_error(host, port, exc) from None
        self._server: WSGIServer | None = server

    def close(self) -> None:
        """Stop serving; safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
