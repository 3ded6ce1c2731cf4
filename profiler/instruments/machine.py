"""The machine a run measures on: its environment record (run.json) and the peak FLOP/s MFU divides by.

MFU = achieved model FLOP/s / peak FLOP/s (PaLM appendix B). The peak is the device's dense
(no 2:4 sparsity) tensor throughput for the run's matmul dtype: from a table of datasheet figures
for known NVIDIA GPUs (the bf16 values torchtitan's tools/utils.py `get_peak_flops` uses, the
rest from NVIDIA's datasheets), else measured. torchtitan falls back to the A100's figure for an
unknown GPU; a wrong denominator makes MFU wrong silently, so we calibrate instead: the best
rate of square matmuls in that dtype, measured once per (device, threads, torch, dtype) and cached
in $GLMPERF_CACHE/peak_flops.json (default ~/.cache/glmperf/). On CPU there is no honest table
(the same model name covers many SKUs, and the rate depends on the threads torch uses), so CPUs
are always calibrated. Measured on the 2-core AMD EPYC CI machine: ~186 GFLOP/s fp32, ~730 bf16.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from profiler.instruments.nvml import nvml_status

if TYPE_CHECKING:
    import torch

# (pattern on the CUDA device name, dense FLOP/s by matmul kind, source). First match wins, so
# specific names (H100 NVL / PCIe) come before general ones. No "bf16" where the GPU has no bf16
# tensor cores (V100): that dtype is calibrated.
GPU_PEAKS: tuple[tuple[str, dict[str, float], str], ...] = (
    (r"H100.*NVL", {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12},
     "NVIDIA H100 NVL datasheet (bf16 as torchtitan get_peak_flops)"),
    (r"H100.*PCIe", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
     "NVIDIA H100 PCIe datasheet (bf16 as torchtitan get_peak_flops)"),
    (r"H200.*NVL", {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12},
     "NVIDIA H200 NVL datasheet"),
    (r"H100|H200|GH200", {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
     "NVIDIA H100/H200 SXM datasheet (bf16 as torchtitan get_peak_flops)"),
    (r"A100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
     "NVIDIA A100 datasheet (bf16 as torchtitan get_peak_flops)"),
    (r"B200", {"bf16": 2.25e15, "fp16": 2.25e15},
     "NVIDIA Blackwell datasheet (as torchtitan get_peak_flops)"),
    (r"V100S", {"fp16": 130e12, "fp32": 16.4e12}, "NVIDIA V100S datasheet"),
    (r"V100.*PCIE", {"fp16": 112e12, "fp32": 14e12}, "NVIDIA V100 PCIe datasheet"),
    (r"V100", {"fp16": 125e12, "fp32": 15.7e12}, "NVIDIA V100 SXM2 datasheet"),
    (r"L40S", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
     "NVIDIA L40S datasheet (bf16 as torchtitan get_peak_flops)"),
    (r"\bL4\b", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}, "NVIDIA L4 datasheet"),
    (r"\bA10\b", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}, "NVIDIA A10 datasheet"),
    (r"RTX 4090", {"bf16": 165.2e12, "fp16": 165.2e12, "tf32": 82.6e12, "fp32": 82.6e12},
     "NVIDIA Ada whitepaper, RTX 4090 (fp32 accumulate)"),
)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


MATMUL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile")
"""The CPU ISA flags that decide how fast a CPU runs fp32, bf16 and fp16 matmuls."""


def cpu_flags() -> list[str]:
    """The matmul-relevant ISA flags this CPU has (/proc/cpuinfo; [] where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in MATMUL_FLAGS if f in have]
    except OSError:
        pass
    return []


def device_name(device: torch.device | str) -> str:
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


def environment(device: torch.device | str, *, world_size: int = 1) -> dict[str, Any]:
    """What run.json records about the machine: versions, device, CPU, memory, ranks, NVML.

    `world_size` is the run's (the launcher knows it; its own environment says 1).
    """
    import torch

    from optimizers.threads import usable_cpus

    device = torch.device(device)
    nvml_ok, nvml_why = nvml_status(device)
    env: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "platform": platform.platform(), "hostname": socket.gethostname(),
        "device": str(device), "device_name": device_name(device), "cpu_model": cpu_model(), "cpu_flags": cpu_flags(),
        "cpu_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "cpu_affinity": usable_cpus(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "world_size": world_size,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "nvml": {"available": nvml_ok, "reason": nvml_why},
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_memory_bytes=props.total_memory, cuda_capability=f"{props.major}.{props.minor}",
                   cuda_device_count=torch.cuda.device_count())
    return env


def has_cuda() -> bool:
    """Whether this machine can run CUDA (imports torch: call it only where a run's device matters)."""
    import torch

    return torch.cuda.is_available()


def _matmul_kind(dtype: torch.dtype) -> str:
    import torch

    if dtype == torch.float32:  # TF32 tensor cores serve fp32 matmuls unless precision is "highest"
        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype).removeprefix("torch."))


MATMUL_DTYPES = {"off": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""The dtype a run's matmuls run in (torch's name), by `switches.amp.dtype`: MFU divides by that dtype's peak."""


def matmul_dtype(amp: str) -> torch.dtype:
    """The torch dtype of a run's matmuls with `switches.amp.dtype` = `amp`."""
    import torch

    dtype: torch.dtype = getattr(torch, MATMUL_DTYPES[amp])
    return dtype


def run_peak(device: torch.device | str, amp: str) -> dict[str, Any]:
    """The peak one device of a run can reach with its matmul dtype: {"flops", "source", "dtype"}.

    One device: a GPU, or the whole CPU of one host (ranks on one host share it, so the MFU of a
    run divides by this times the number of GPUs, or of hosts on CPU).
    """
    dtype = matmul_dtype(amp)
    flops, source = peak_flops(device, dtype)
    return {"flops": flops, "source": source, "dtype": _matmul_kind(dtype)}



def matmul_peaks(device: torch.device | str) -> dict[str, float]:
    """The device's peak for each matmul dtype a run could switch to, by kind (`fp32` or `tf32`, `bf16`,
    `fp16`): what tells whether low precision pays off here. Calibrated (and cached) where no table
    knows the device; a CPU gets fp32 and bf16 (its fp16 autocast is not a speed path)."""
    import torch

    device = torch.device(device)
    amps = ("off", "bf16", "fp16") if device.type == "cuda" else ("off", "bf16")
    return {_matmul_kind(matmul_dtype(amp)): peak_flops(device, matmul_dtype(amp))[0] for amp in amps}


def table_peak(name: str, dtype: torch.dtype) -> tuple[float, str] | None:
    """The datasheet peak of a known GPU for `dtype`'s matmuls, or None."""
    kind = _matmul_kind(dtype)
    for pattern, peaks, source in GPU_PEAKS:
        if re.search(pattern, name, re.IGNORECASE):
            return (peaks[kind], f"table: {source}, dense {kind}") if kind in peaks else None
    return None


def cache_dir() -> Path:
    """Where measurements of this machine are kept between commands: $GLMPERF_CACHE, else ~/.cache/glmperf."""
    return Path(os.environ.get("GLMPERF_CACHE") or "~/.cache/glmperf").expanduser()


def _cache_file() -> Path:
    return cache_dir() / "peak_flops.json"


def peak_flops(device: torch.device | str, dtype: torch.dtype, *, budget_s: float = 0.5) -> tuple[float, str]:
    """Peak dense matmul FLOP/s of `device` in `dtype`, and where the figure comes from (for run.json).

    A calibration taken while other processes kept the CPU busy (a shared CI runner) is cached
    as provisional: later calls measure again and keep the best, until one is taken undisturbed.
    """
    import torch

    device = torch.device(device)
    name = device_name(device)
    if device.type == "cuda" and (found := table_peak(name, dtype)):
        return found
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    key = f"{device.type}|{name}|threads={threads}|torch={torch.__version__}|{_matmul_kind(dtype)}"
    path = _cache_file()
    try:
        cache = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    old = cache.get(key)
    if old and not old.get("contended"):
        return float(old["flops"]), f"{old['source']} (cached {old['measured']})"
    new = calibrate(device, dtype, budget_s=budget_s)
    if old and old["flops"] > new["flops"]:  # disturbance only lowers a rate: the higher one stands
        contended = new["contended"] and old["contended"]
        source = old["source"] if contended else old["source"].split("; other processes")[0]
        new = {**old, "source": source, "contended": contended}
    cache[key] = {**new, "measured": time.strftime("%Y-%m-%d")}
    try:  # atomic: concurrent ranks may calibrate at once; the last complete write wins
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a recalibration next time
    return float(new["flops"]), new["source"]


def _work(kind: str, shapes: tuple[tuple[int, ...], ...], dtype: torch.dtype, device: torch.device
          ) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(fp32 call, `dtype` call) for one matmul or fused attention, as autocast would run it: the
    activation cast to `dtype` inside the call, the weight cast once (autocast caches it). A matmul's
    backward calls are matmuls of their own in the operator table; attention's backward is not, so
    attention is timed forward and backward (its low-precision backward can be far slower: 20x fp32
    at the tiny preset's shapes on an AMX CPU)."""
    import torch

    tensors = [torch.randn(*shape, device=device) for shape in shapes]
    if kind == "mm":
        a, b = tensors
        low_b = b.to(dtype)
        return (lambda: torch.matmul(a, b)), (lambda: torch.matmul(a.to(dtype), low_b))
    q, k, v = (t.requires_grad_() for t in tensors)
    gqa = q.shape[-3] != k.shape[-3]

    def attend(dt: torch.dtype | None) -> Any:
        cast = (lambda t: t.to(dt)) if dt is not None else (lambda t: t)
        out = torch.nn.functional.scaled_dot_product_attention(cast(q), cast(k), cast(v), is_causal=True,
                                                                enable_gqa=gqa)
        return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return (lambda: attend(None)), (lambda: attend(dtype))


def matmul_speedup(device: torch.device | str, work: list[tuple[str, tuple[tuple[int, ...], ...], float]],
                   dtype: torch.dtype, *, reps: int = 7) -> float:
    """How much faster the run's own matmuls and attention would run in `dtype` than in fp32: their
    total time per step in fp32 over their time in `dtype`, each call the best of `reps`,
    alternating. A device's peak ratio is measured on big squares; a small model's matrices, the
    casts autocast adds and an attention kernel without a fast low-precision path can leave nothing
    of it (bf16 attention ran 0.7x fp32 at the tiny preset's shapes on an avx512_bf16 CPU)."""
    import torch

    device = torch.device(device)
    fp32_s = low_s = 0.0
    for kind, shapes, calls in work:
        key = (str(device), kind, shapes, str(dtype), reps)
        if key not in _SHAPE_TIMES:
            _SHAPE_TIMES[key] = _best_times(_work(kind, shapes, dtype, device), device, reps)
        fp32, low = _SHAPE_TIMES[key]
        fp32_s += calls * fp32
        low_s += calls * low
    return fp32_s / low_s if low_s > 0 else math.nan


_SHAPE_TIMES: dict[tuple[Any, ...], tuple[float, float]] = {}
"""Per process: runs of one plan (verify, sweep, tune) share their shapes, measured once."""


def _best_times(pair: tuple[Callable[[], Any], Callable[[], Any]], device: torch.device, reps: int
                ) -> tuple[float, float]:
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = [math.inf, math.inf]
    for _ in range(reps + 1):
        for i, call in enumerate(pair):
            sync()
            t0 = time.perf_counter()
            call()
            sync()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best[0], best[1]


CONTENDED_CORES = 0.5
"""Other processes' CPU use (in cores) during a CPU calibration above which it counts as disturbed."""


def calibrate(device: torch.device, dtype: torch.dtype, *, budget_s: float = 0.5, rounds: int = 5
              ) -> dict[str, Any]:
    """Best rate of square matmuls over `rounds` rounds sharing ~`budget_s` seconds (CPU: the best
    single call; CUDA: the best round between synchronizations).

    Returns {"flops", "source", "contended"}; on CPU, `contended` says whether other processes
    used more than CONTENDED_CORES cores meanwhile (the figure is then likely low).
    """
    import torch

    n = 1024 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    me = psutil.Process()
    psutil.cpu_percent(None)
    me.cpu_percent(None)
    torch.mm(a, b, out=out)  # warm up (kernel selection, thread pool)
    sync()
    t0 = time.perf_counter()
    torch.mm(a, b, out=out)
    sync()
    reps = max(1, int(budget_s / rounds / max(time.perf_counter() - t0, 1e-6)))
    best = 0.0
    for _ in range(rounds):
        if device.type == "cpu":  # the best single call: a peak, not an average over preemptions
            for _ in range(reps):
                t0 = time.perf_counter()
                torch.mm(a, b, out=out)
                best = max(best, 2 * n**3 / (time.perf_counter() - t0))
        else:  # launches are async: time a batch of calls between synchronizations
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b, out=out)
            sync()
            best = max(best, reps * 2 * n**3 / (time.perf_counter() - t0))
    others = max(0.0, (psutil.cpu_percent(None) * (os.cpu_count() or 1) - me.cpu_percent(None)) / 100.0)
    contended = device.type == "cpu" and others > CONTENDED_CORES
    source = f"calibrated: best of {rounds}x{reps} {n}x{n} {_matmul_kind(dtype)} matmuls"
    if device.type == "cpu":
        source += f", {torch.get_num_threads()} threads"
    if contended:
        source += f"; other processes used {others:.1f} cores meanwhile, so it may be low"
    return {"flops": best, "source": source, "contended": contended}
