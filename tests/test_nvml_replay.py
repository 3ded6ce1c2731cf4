"""NVML without a GPU: recorded readings replayed through the live conversion code, and backend choice."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from profiler.instruments.nvml import NvmlBackend, ReplayBackend, decode_throttle, nvml_row
from profiler.instruments.samplers import CpuBackend, Sampler, choose_backend

DATA = Path(__file__).parent / "data" / "nvml_replay"
RECORDINGS = sorted(DATA.glob("*.json"))
SYNTHETIC = DATA / "synthetic_h100.json"


def _raw(path: Path) -> list[dict[str, Any]]:
    return [raw for reading in json.loads(path.read_text())["readings"] for raw in reading["devices"]]


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_replay_converts_into_our_units(path: Path) -> None:
    raws = _raw(path)
    backend = ReplayBackend(path)
    rows = [row for _ in range(len(json.loads(path.read_text())["readings"])) for row in backend.read()]
    assert len(rows) == len(raws)
    for raw, row in zip(raws, rows, strict=True):
        assert row["device"] == raw["index"]
        assert row["gpu_util_pct"] == raw["utilization"]["gpu"]
        assert row["mem_used_bytes"] == raw["memory"]["used"]
        assert row["mem_total_bytes"] == raw["memory"]["total"]
        assert row["power_w"] == pytest.approx(raw["power_mw"] / 1000)  # mW -> W
        assert row["pcie_rx_bytes_per_s"] == raw["pcie_rx_kbps"] * 1024  # KB/s -> bytes/s
        assert row["pcie_tx_bytes_per_s"] == raw["pcie_tx_kbps"] * 1024
        assert row["temperature_c"] == raw["temperature_c"] and row["sm_clock_mhz"] == raw["sm_clock_mhz"]
        assert row["throttle_reasons"] == raw["throttle_reasons"]
        assert row["throttle"] == "|".join(decode_throttle(raw["throttle_reasons"]))
        if raw["energy_mj"] is not None:
            assert row["energy_j"] == pytest.approx(raw["energy_mj"] / 1000)  # mJ -> J


def test_synthetic_fixture_throttling_is_decoded() -> None:
    rows = [nvml_row(raw) for raw in _raw(SYNTHETIC)]
    decoded = [r["throttle"] for r in rows]
    assert decoded[0] == "gpu_idle" and "" in decoded
    assert "sw_power_cap" in decoded and "sw_power_cap|sw_thermal_slowdown" in decoded
    capped = [r for r in rows if r["throttle"] == "sw_power_cap"]
    assert all(r["power_w"] > 0.99 * r["power_limit_w"] for r in capped)  # the fixture is self-consistent
    energy = [r["energy_j"] for r in rows]
    assert energy == sorted(energy)  # a counter since driver load


def test_decode_throttle_bits() -> None:
    assert decode_throttle(0) == []
    assert decode_throttle(0x24) == ["sw_power_cap", "sw_thermal_slowdown"]
    assert decode_throttle(0x1 | 0x40 | 0x800) == ["gpu_idle", "hw_thermal_slowdown", "0x800"]


def test_unsupported_fields_become_nan_not_a_lost_row() -> None:
    row = nvml_row({"index": 1, "utilization": {"gpu": 50, "memory": 20}, "memory": None, "power_mw": None,
                    "throttle_reasons": None})
    assert row["device"] == 1 and row["gpu_util_pct"] == 50.0
    assert math.isnan(row["power_w"]) and math.isnan(row["mem_used_bytes"]) and math.isnan(row["energy_j"])
    assert row["throttle"] is None


def test_replay_through_the_sampler_wraps_around(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = []
    writer = SimpleNamespace(add_samples=rows.extend)
    backend = ReplayBackend(SYNTHETIC)
    n = len(backend.readings)
    sampler = Sampler(writer, backend, hz=500, rank=2, current_step=lambda: 5)
    sampler.start()
    deadline = time.monotonic() + 20
    while len(rows) < n + 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.close()
    assert len(rows) >= n + 3
    assert {r["source"] for r in rows} == {"nvml_replay"} and {r["rank"] for r in rows} == {2}
    assert {r["step"] for r in rows} == {5}
    assert rows[n]["power_w"] == rows[0]["power_w"]  # wrapped around to the first reading
    assert sampler.summary()["readings"] == n and sampler.summary()["read_errors"] == 0


class FakeNvml:
    """pynvml's surface NvmlBackend uses, answering from one recorded raw reading."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1

    class NVMLError(Exception):
        pass

    def __init__(self, raw: dict[str, Any], unsupported: tuple[str, ...] = ()) -> None:
        self.raw, self.unsupported, self.inits = raw, unsupported, 0

    def _get(self, key: str) -> Any:
        if key in self.unsupported:
            raise self.NVMLError("Not Supported")
        return self.raw[key]

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle{index}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return self.raw["name"].encode()

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(**self._get("utilization"))

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(**self._get("memory"))

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return self._get("power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return self._get("power_limit_mw")

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        return self._get("energy_mj")

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return self._get("temperature_c")

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        return self._get("sm_clock_mhz" if clock == self.NVML_CLOCK_SM else "mem_clock_mhz")

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        return self._get("pcie_tx_kbps" if counter == self.NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_kbps")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return self._get("throttle_reasons")


def test_live_backend_reads_what_replay_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _raw(SYNTHETIC)[-3]
    fake = FakeNvml(raw)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = NvmlBackend([0])
    assert backend.read_raw() == [raw]  # the recording format is exactly what the live backend produces
    assert backend.read() == [nvml_row(raw)]
    backend.close()
    backend.close()
    assert fake.inits == 0


def test_live_backend_keeps_the_row_when_a_field_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(_raw(SYNTHETIC)[5], unsupported=("energy_mj", "pcie_tx_kbps"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = NvmlBackend([0])
    (row,) = backend.read()
    assert math.isnan(row["energy_j"]) and math.isnan(row["pcie_tx_bytes_per_s"]) and row["power_w"] > 0
    assert set(backend.summary()["unsupported_fields"]) == {"energy_mj", "pcie_tx_kbps"}
    raw = _raw(SYNTHETIC)[5]
    every = FakeNvml(raw, unsupported=tuple(k for k in raw if k not in ("index", "name")))
    monkeypatch.setitem(sys.modules, "pynvml", every)
    with pytest.raises(RuntimeError, match="every NVML query failed"):
        NvmlBackend([0]).read()


def test_choose_backend_on_cpu_says_why_not_nvml() -> None:
    backend, why = choose_backend("cpu")
    assert isinstance(backend, CpuBackend) and backend.source == "cpu"
    assert why == "no CUDA device: the run's device is cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="NVML works on this machine")
def test_choose_backend_for_cuda_without_a_driver_falls_back_with_the_nvml_error() -> None:
    backend, why = choose_backend("cuda")
    assert isinstance(backend, CpuBackend)
    assert why.startswith(("pynvml.nvmlInit failed: ", "pynvml not importable: "))
