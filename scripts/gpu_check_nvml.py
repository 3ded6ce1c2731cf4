"""Record real NVML readings on a CUDA machine into tests/data/nvml_replay/recorded_<gpu>.json.

    python scripts/gpu_check_nvml.py [--device 0] [--readings 50] [--hz 10] [--out tests/data/nvml_replay]

It reads the device through `NvmlBackend.read_raw` (NVML's own types and units, the format
`ReplayBackend` replays) while a bf16 matmul load runs through the middle third of the recording,
so the file holds idle, busy and cooling-down readings. Then it converts every reading with
`nvml_row` and checks the rows are in range; exit status 1 names the failed checks. The recording
replaces the synthetic fixture as the replay tests' ground truth (tests/test_nvml_replay.py
replays every *.json in that folder).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler.instruments.nvml import NvmlBackend, nvml_row  # noqa: E402


def _load(device: torch.device, stop: threading.Event) -> None:
    """Keep the GPU busy with bf16 matmuls until `stop`."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a @ b
        torch.cuda.synchronize(device)


def check(rows: list[dict]) -> list[str]:
    """What is wrong with the converted rows (empty when they look like a real GPU)."""
    problems = []

    def bad(name: str, ok: Callable[[float], bool]) -> None:
        values = [r[name] for r in rows if not (isinstance(r[name], float) and math.isnan(r[name]))]
        if not values:
            problems.append(f"{name}: never supported on this device")
        elif not all(ok(v) for v in values):
            problems.append(f"{name}: out of range, e.g. {values[:5]}")

    bad("gpu_util_pct", lambda v: 0 <= v <= 100)
    bad("mem_used_bytes", lambda v: v > 0)
    bad("power_w", lambda v: 1 < v < 2000)
    bad("temperature_c", lambda v: 5 < v < 110)
    bad("sm_clock_mhz", lambda v: 100 < v < 4000)
    bad("pcie_rx_bytes_per_s", lambda v: v >= 0)
    if max(r["gpu_util_pct"] for r in rows) < 50:
        problems.append("gpu_util_pct never reached 50% under the matmul load")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--readings", type=int, default=50)
    parser.add_argument("--hz", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("tests/data/nvml_replay"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check_nvml: no CUDA device", file=sys.stderr)
        return 1
    device = torch.device("cuda", args.device)
    backend = NvmlBackend([args.device])
    name = backend.names[args.device]
    stop, load = threading.Event(), None
    readings, t0 = [], time.monotonic()
    try:
        for i in range(args.readings):
            if i == args.readings // 3:
                load = threading.Thread(target=_load, args=(device, stop), daemon=True)
                load.start()
            if i == 2 * args.readings // 3:
                stop.set()
            readings.append({"t": round(time.monotonic() - t0, 4), "devices": backend.read_raw()})
            time.sleep(max(0.0, (i + 1) / args.hz - (time.monotonic() - t0)))
    finally:
        stop.set()
        if load is not None:
            load.join()
        unsupported = backend.summary()["unsupported_fields"]
        backend.close()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"recorded_{re.sub(r'[^a-z0-9]+', '_', name.lower()).strip('_')}.json"
    path.write_text(json.dumps({
        "source": f"recorded by scripts/gpu_check_nvml.py on {name}, torch {torch.__version__}, "
                  f"{time.strftime('%Y-%m-%d')}; bf16 matmul load during the middle third",
        "format": "readings[].devices[]: raw NVML values as NvmlBackend.read_raw returns them "
                  "(see profiler/instruments/nvml.py)",
        "interval_s": 1.0 / args.hz, "unsupported_fields": unsupported, "readings": readings,
    }, indent=1), encoding="utf-8")
    rows = [nvml_row(raw) for r in readings for raw in r["devices"]]
    problems = check(rows)
    print(f"gpu_check_nvml: {len(readings)} readings of {name} -> {path}")
    for p in problems:
        print(f"gpu_check_nvml: FAIL {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
