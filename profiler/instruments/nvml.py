"""The NVML sampler backend, and a replay backend that feeds recorded readings through the same code.

A reading is taken in two stages so the conversion is testable without a GPU:

1. `NvmlBackend.read_raw()` asks NVML (pynvml) for one device's figures and keeps them in NVML's
   own types and units: a "raw reading", the dict below. `ReplayBackend` reads the same dicts
   from a JSON recording (tests/data/nvml_replay/; scripts/gpu_check_nvml.py records one).
2. `nvml_row(raw)` converts a raw reading into a samples.parquet row in our units. Both backends
   use it, so a replayed recording exercises exactly the conversion a live run does.

Raw reading (None for a field the device does not support, e.g. energy on pre-Volta GPUs):

- `index`: CUDA device index (torch's numbering); `name`: the device name.
- `utilization`: {"gpu": %, "memory": %} ints, nvmlDeviceGetUtilizationRates (share of the last
  sample period in which a kernel ran / device memory was read or written).
- `memory`: {"total", "used", "free"} bytes, nvmlDeviceGetMemoryInfo.
- `power_mw`, `power_limit_mw`: milliwatts, nvmlDeviceGetPowerUsage / GetEnforcedPowerLimit.
- `energy_mj`: millijoules since the driver loaded, nvmlDeviceGetTotalEnergyConsumption.
- `temperature_c`: degrees C, nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU).
- `sm_clock_mhz`, `mem_clock_mhz`: MHz, nvmlDeviceGetClockInfo(NVML_CLOCK_SM / NVML_CLOCK_MEM).
- `pcie_tx_kbps`, `pcie_rx_kbps`: KB/s (KB = 1024 bytes), nvmlDeviceGetPcieThroughput; NVML
  measures them over a 20 ms window inside the call.
- `throttle_reasons`: bitmask, nvmlDeviceGetCurrentClocksEventReasons (formerly
  ...ClocksThrottleReasons); decoded with THROTTLE_REASONS.

Rows (samples.parquet, source "nvml" or "nvml_replay"): `device`, `gpu_util_pct`,
`mem_util_pct`, `mem_used_bytes`, `mem_total_bytes`, `power_w`, `power_limit_w`, `energy_j`,
`temperature_c`, `sm_clock_mhz`, `mem_clock_mhz`, `pcie_tx_bytes_per_s`, `pcie_rx_bytes_per_s`,
`throttle_reasons` (the bitmask) and `throttle` (decoded names joined by "|", "" when none);
NaN / None where the raw field was None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


NAN = float("nan")

THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""nvmlClocksEventReason* bits (nvml.h); other set bits decode as their hex value."""


def decode_throttle(mask: int) -> list[str]:
    """Names of the set bits of a clocks-event (throttle) reasons bitmask, lowest bit first."""
    names, bit = [], 1
    while bit <= mask:
        if mask & bit:
            names.append(THROTTLE_REASONS.get(bit, hex(bit)))
        bit <<= 1
    return names


def _scaled(value: float | None, factor: float) -> float:
    return NAN if value is None else float(value) * factor


def nvml_row(raw: dict[str, Any]) -> dict[str, Any]:
    """One raw NVML reading (NVML's types and units) -> one samples row in ours (see module doc)."""
    util = raw.get("utilization") or {}
    mem = raw.get("memory") or {}
    reasons = raw.get("throttle_reasons")
    return {
        "device": int(raw["index"]),
        "gpu_util_pct": _scaled(util.get("gpu"), 1.0),
        "mem_util_pct": _scaled(util.get("memory"), 1.0),
        "mem_used_bytes": _scaled(mem.get("used"), 1.0),
        "mem_total_bytes": _scaled(mem.get("total"), 1.0),
        "power_w": _scaled(raw.get("power_mw"), 1e-3),
        "power_limit_w": _scaled(raw.get("power_limit_mw"), 1e-3),
        "energy_j": _scaled(raw.get("energy_mj"), 1e-3),
        "temperature_c": _scaled(raw.get("temperature_c"), 1.0),
        "sm_clock_mhz": _scaled(raw.get("sm_clock_mhz"), 1.0),
        "mem_clock_mhz": _scaled(raw.get("mem_clock_mhz"), 1.0),
        "pcie_tx_bytes_per_s": _scaled(raw.get("pcie_tx_kbps"), 1024.0),
        "pcie_rx_bytes_per_s": _scaled(raw.get("pcie_rx_kbps"), 1024.0),
        "throttle_reasons": NAN if reasons is None else int(reasons),
        "throttle": None if reasons is None else "|".join(decode_throttle(int(reasons))),
    }


def cuda_index(device: torch.device | str) -> int:
    """torch's index of a CUDA device (`cuda` alone means the current one)."""
    import torch

    device = torch.device(device)
    return torch.cuda.current_device() if device.index is None else device.index


def _handle(pynvml: Any, index: int) -> Any:
    """The NVML handle of torch's CUDA device `index`.

    NVML numbers all GPUs of the machine, torch only the visible ones (CUDA_VISIBLE_DEVICES), so
    match by UUID first, then by the CUDA_VISIBLE_DEVICES entry, then by position.
    """
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:  # older torch without .uuid, or a UUID form NVML does not take
        visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
        if index < len(visible) and not visible[index].isdigit():
            return pynvml.nvmlDeviceGetHandleByUUID(visible[index])
        return pynvml.nvmlDeviceGetHandleByIndex(int(visible[index]) if index < len(visible) else index)


class NvmlBackend:
    """Reads utilization, memory, power, energy, temperature, clocks, PCIe and throttling via NVML.

    Raises at construction when pynvml is missing or `nvmlInit` fails (`choose_backend` turns
    that into the reason the CPU backend is used). A field the device does not support reads as
    None and is listed in `unsupported`; the rest of the row is kept (MLflow issue 14736 dropped
    every GPU metric when one failed). A read where every field fails raises.
    """

    source = "nvml"

    def __init__(self, devices: Sequence[int]) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        try:
            self.handles = {i: _handle(pynvml, i) for i in devices}
            self.names = {i: _text(pynvml.nvmlDeviceGetName(h)) for i, h in self.handles.items()}
        except Exception:
            pynvml.nvmlShutdown()
            raise
        self.unsupported: dict[str, str] = {}
        self._closed = False
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def read_raw(self) -> list[dict[str, Any]]:
        """One raw reading per device, in NVML's types and units (see the module docstring)."""
        return [self._read_device(i, h) for i, h in self.handles.items()]

    def read(self) -> list[dict[str, Any]]:
        return [nvml_row(raw) for raw in self.read_raw()]

    def summary(self) -> dict[str, Any]:
        return {"devices": self.names, "unsupported_fields": dict(self.unsupported)}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.nvml.nvmlShutdown()

    def _read_device(self, index: int, h: Any) -> dict[str, Any]:
        n = self.nvml
        calls = {
            "utilization": lambda: _utilization(n.nvmlDeviceGetUtilizationRates(h)),
            "memory": lambda: _memory(n.nvmlDeviceGetMemoryInfo(h)),
            "power_mw": lambda: n.nvmlDeviceGetPowerUsage(h),
            "power_limit_mw": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
            "energy_mj": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
            "temperature_c": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
            "pcie_tx_kbps": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES),
            "pcie_rx_kbps": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES),
            "throttle_reasons": lambda: self._reasons(h),
        }
        raw: dict[str, Any] = {"index": index, "name": self.names[index]}
        failed = []
        for key, call in calls.items():
            try:
                raw[key] = call()
            except n.NVMLError as exc:
                raw[key] = None
                self.unsupported.setdefault(key, str(exc))
                failed.append(exc)
        if len(failed) == len(calls):
            raise RuntimeError(f"every NVML query failed for cuda:{index}: {failed[0]}")
        return raw


def _utilization(u: Any) -> dict[str, int]:
    return {"gpu": int(u.gpu), "memory": int(u.memory)}


def _memory(m: Any) -> dict[str, int]:
    return {"total": int(m.total), "used": int(m.used), "free": int(m.free)}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ReplayBackend:
    """Replays a recorded NVML sequence (a JSON file of raw readings) through `nvml_row`.

    The file: {"source": "where it came from", "readings": [{"t": s, "devices": [raw, ...]}, ...]}.
    Each `read()` returns the next reading's rows, starting over after the last.
    """

    source = "nvml_replay"

    def __init__(self, path: str | Path) -> None:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        self.recording = data
        self.readings: list[dict[str, Any]] = data["readings"]
        if not self.readings:
            raise ValueError(f"{path}: no readings")
        self._next = 0

    def read(self) -> list[dict[str, Any]]:
        reading = self.readings[self._next % len(self.readings)]
        self._next += 1
        return [nvml_row(raw) for raw in reading["devices"]]

    def summary(self) -> dict[str, Any]:
        return {"recording": self.recording.get("source", ""), "readings": len(self.readings)}

    def close(self) -> None: ...


def nvml_status(device: torch.device | str) -> tuple[bool, str]:
    """Whether the NVML sampler can run for `device`, and why (or why not) in words for run.json."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return False, f"no CUDA device: the run's device is {device.type}"
    try:
        import pynvml
    except ImportError as exc:
        return False, f"pynvml not importable: {exc}"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return False, f"pynvml.nvmlInit failed: {exc}"
    pynvml.nvmlShutdown()
    return True, "pynvml initialized"
