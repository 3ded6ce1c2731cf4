"""Live metrics for real: a Prometheus server (Debian's package, which .ci/run installs) scraping
running profile-run jobs finds their series with their labels, and the shipped input-bound alert
fires for the job whose loader is slow and not for the healthy one; ports that cannot be served on
are refused before training; the user's own loop serves the same figures; recorded NVML readings
come out in the metrics' units."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import yaml

from optimizers.config import ConfigError
from profiler import api, store
from profiler.instruments.nvml import ReplayBackend
from profiler.instruments.prometheus import Figures, PortError
from tests.conftest import ROOT, TINY, cli, linear_steps
from tests.test_nvml_replay import RECORDINGS

PROMETHEUS = Path("/usr/bin/prometheus")
RULES = ROOT / "configs" / "monitoring" / "alerts.yml"
T = TypeVar("T")


def free_port(span: int = 1) -> int:
    """A port with `span` free ports from it (for ranks on port + local rank)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + span < 65535 and all(_free(p) for p in range(port, port + span)):
            return port
    raise AssertionError("no free port")


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def until(probe: Callable[[], T | None], what: str, timeout: float = 90) -> T:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if (found := probe()) is not None:
                return found
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def query(base: str, expr: str) -> list[dict[str, Any]]:
    answer = json.loads(fetch(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}"))
    return answer["data"]["result"]


def input_alert_name() -> str:
    """The shipped rule that watches the loader's share of the step (the diagnosis' input_bound)."""
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    (name,) = [r["alert"] for r in rules if "glmperf_data_wait_ratio" in r["expr"]]
    return name


@contextlib.contextmanager
def prometheus(tmp_path: Path, targets: list[str]) -> Iterator[str]:
    """A real Prometheus scraping `targets` every second with the shipped rules, their `for` set to 0s
    (the expressions are what is tested; production waits minutes)."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            rule["for"] = "0s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": ["rules.yml"],
              "scrape_configs": [{"job_name": "glmperf", "honor_labels": True,
                                  "static_configs": [{"targets": targets}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen([str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                               "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        until(lambda: fetch(f"{base}/-/ready") or None, "prometheus ready", timeout=30)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(not PROMETHEUS.exists(), reason=f"no Prometheus at {PROMETHEUS} (apt-get install prometheus)")
def test_prometheus_scrapes_running_jobs_and_the_input_rule_fires_on_the_slow_one(tmp_path: Path) -> None:
    slow_port, healthy_port = free_port(span=2), free_port()
    sets = [arg for o in TINY if not o.startswith("profile.trace_window") for arg in ("--set", o)]
    slow = cli("--steps", "5000", "--nproc", "2", "--name", "slow", "--no-trace", "--metrics-port", str(slow_port),
               "--set", "data.io_delay_ms=30", *sets, runs_dir=tmp_path / "runs")
    healthy = cli("--steps", "5000", "--name", "healthy", "--no-trace", "--metrics-port", str(healthy_port), *sets,
                  runs_dir=tmp_path / "runs")
    targets = [f"127.0.0.1:{p}" for p in (slow_port, slow_port + 1, healthy_port)]
    try:
        with prometheus(tmp_path, targets) as base:
            def series() -> set[tuple[str, str]] | None:
                found = {(r["metric"]["run_name"], r["metric"]["rank"]) for r in query(base, "glmperf_step_seconds")}
                return found if len(found) == 3 else None

            assert until(series, "step time of every rank") == {("slow", "0"), ("slow", "1"), ("healthy", "0")}
            (loss,) = query(base, 'glmperf_loss{run_name="healthy"}')
            assert set(loss["metric"]) >= {"run_id", "run_name", "rank", "host"}
            assert loss["metric"]["run_id"].endswith("-healthy-" + loss["metric"]["run_id"].rsplit("-", 1)[1])
            assert math.isfinite(float(loss["value"][1]))
            latency = query(base, 'glmperf_collective_latency_seconds{run_name="slow", collective="all_reduce"}')
            assert {r["metric"]["rank"] for r in latency} == {"0", "1"}

            name = input_alert_name()

            def firing() -> list[dict[str, Any]] | None:
                alerts = json.loads(fetch(f"{base}/api/v1/alerts"))["data"]["alerts"]
                mine = [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]
                return mine or None

            alerts = until(firing, f"{name} firing")
            assert {a["labels"]["run_name"] for a in alerts} == {"slow"}  # the healthy job's loader keeps up
    finally:
        for job in (slow, healthy):
            job.send_signal(signal.SIGTERM)
        for job in (slow, healthy):
            job.communicate(timeout=120)
    for port in (slow_port, slow_port + 1, healthy_port):  # a job that ended serves nothing
        with pytest.raises(urllib.error.URLError):
            fetch(f"http://127.0.0.1:{port}/metrics")


def test_a_port_in_use_or_out_of_range_is_refused_before_training(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job = cli("--steps", "2", "--metrics-port", str(port), runs_dir=runs)
        _, err = job.communicate(timeout=120)
        assert job.returncode == 2
        assert err.strip().count("\n") == 0 and f"port {port} is in use" in err, err
        with pytest.raises(PortError, match=f"port {port} is in use"):
            api.run(name="mine", runs_dir=runs, profile={"metrics_port": port}).start()
    job = cli("--steps", "2", "--metrics-port", "70000", runs_dir=runs)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 2 and "profile.metrics_port" in err and "allowed" in err, err
    with pytest.raises(ConfigError, match="profile.metrics_port: .*allowed"):
        api.run(name="mine", runs_dir=runs, profile={"metrics_port": 70000}).start()
    assert not runs.exists() or not list(runs.iterdir())  # nothing was created, nothing trained


def test_a_users_own_loop_serves_its_steps_and_stops_serving_at_its_end(tmp_path: Path) -> None:
    port = free_port()
    model = torch.nn.Linear(16, 16)
    with api.run(name="own", runs_dir=tmp_path / "runs", model=model,
                 profile={"metrics_port": port, "metrics_host": "127.0.0.1", "trace": False}) as run:
        linear_steps(run, model, 5)
        def served() -> str | None:  # the writer hands rows on when the step timer resolves them
            text = fetch(f"http://127.0.0.1:{port}/metrics")
            return text if 'glmperf_steps_total{' in text and "} 5.0" in text else None

        text = until(served, "the loop's five steps served", timeout=30)
    labels = f'host="{socket.gethostname()}",rank="0",run_id="{run.dir.name}",run_name="own"'
    assert f"glmperf_steps_total{{{labels}}} 5.0" in text
    assert f'glmperf_run_info{{device="cpu",{labels},source=' in text
    assert "glmperf_mfu_ratio{" in text  # 6N FLOPs per token from the model, the calibrated CPU peak
    assert f"glmperf_loss_non_finite{{{labels}}} 0.0" in text  # a loop measures no grad norm: not a NaN
    with pytest.raises(urllib.error.URLError):
        fetch(f"http://127.0.0.1:{port}/metrics")
    assert store.read_run(run.dir)["status"] == "completed"


def _families(figures: Figures) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in figures.collect()}


def test_recorded_nvml_readings_and_step_rows_in_the_metrics_units() -> None:
    figures = Figures({"run_id": "r", "run_name": "n", "rank": "0", "host": "h"},
                      {"source": "profile-run", "device": "cuda:0", "world_size": "1"})
    figures.flops_per_token, figures.peak_flops = 1e9, 1e12
    rows = ReplayBackend(RECORDINGS[0]).read()
    figures.add_samples(rows)
    figures.add_steps([{"step": 7, "step_s": 0.5, "data_s": 0.2, "tokens": 100, "loss": float("nan"),
                        "grad_norm": 3.0, "lr": 1e-3, "skipped": True, "comm_calls": 4, "comm_time_s": 0.2}])
    figures.add_event({"kind": "rollback", "step": 7})
    figures.add_event({"kind": "checkpoint", "step": 7})  # not a stability event: no series of its own
    got = _families(figures)
    util = {labels["device"]: value for labels, value in got["glmperf_gpu_utilization_ratio"]}
    assert util == {str(r["device"]): pytest.approx(r["gpu_util_pct"] / 100) for r in rows}
    clocks = [value for _, value in got["glmperf_gpu_sm_clock_hertz"]]
    assert clocks == [pytest.approx(r["sm_clock_mhz"] * 1e6) for r in sorted(rows, key=lambda r: r["device"])]
    one = {name: values[0][1] for name, values in got.items() if len(values) == 1}
    assert one["glmperf_loss_non_finite"] == 1.0 and math.isnan(one["glmperf_loss"])
    assert one["glmperf_data_wait_ratio"] == pytest.approx(0.4)
    assert one["glmperf_tokens_per_second"] == pytest.approx(200)
    assert one["glmperf_mfu_ratio"] == pytest.approx(200 * 1e9 / 1e12)
    assert one["glmperf_collective_latency_seconds"] == pytest.approx(0.05)
    assert one["glmperf_skipped_steps"] == 1.0
    events = {labels["kind"]: value for labels, value in got["glmperf_stability_events"]}
    assert events == {"non_finite": 0.0, "loss_spike": 0.0, "loss_plateau": 0.0, "rollback": 1.0}
