"""No device synchronization per step: the trainer and the instruments never read a device value in
a default step, so on CUDA the host runs ahead of the device as it would without glmperf.

A read (`item`, `float`, `bool`, `int`, `tolist`, `numpy` of a tensor) or a copy to a device without
`non_blocking=True` is what makes the host wait for the device; reading a value the device has
already produced (`LazyScalars` once ready) does not, and it runs with torch-function handling off,
so the counter below sees only the blocking kind.
On the CPU nothing waits, but the same count tells whether a CUDA run would (scripts/gpu_check.sh
checks the real thing with torch.cuda.set_sync_debug_mode on a GPU). One read is not counted:
torch.optim's `_get_value` of its step counter, which torch keeps on the host (capturable=False),
so on CUDA it reads host memory.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from reference_model.hooks import StepRecord, TrainerHook
from tests.conftest import tiny_run

READS = {"item", "__float__", "__bool__", "__int__", "__index__", "tolist", "numpy"}
COPIES = {"to", "cuda"}
"""A copy to a device without non_blocking=True waits for the device's stream (host to CUDA too:
torch synchronizes after it). On the CPU it is a no-op, so its arguments tell; torch's own moves
to a tensor's own device (clip_grad's norms) are no-ops on CUDA too and are not counted."""
TORCH_DIR = str(Path(torch.__file__).parent)


def _blocking_copy(name: str, args: tuple, kwargs: dict, caller: str) -> bool:
    if name not in COPIES or caller.startswith(TORCH_DIR):
        return False
    to_device = name == "cuda" or "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args[1:])
    return to_device and not kwargs.get("non_blocking", False)


class CountReads(TorchFunctionMode):
    """Counts value reads of tensors, per step (`step` is set by the hook below)."""

    def __init__(self) -> None:
        super().__init__()
        self.step = -1
        self.reads: Counter[int] = Counter()
        self.what: dict[int, list[str]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        caller = sys._getframe(1).f_code
        host_counter = caller.co_name == "_get_value" and caller.co_filename.endswith("optim/optimizer.py")
        if (name in READS and not host_counter) or _blocking_copy(name, args, kwargs or {}, caller.co_filename):
            self.reads[self.step] += 1
            self.what.setdefault(self.step, []).append(name)
        return func(*args, **(kwargs or {}))


class StepMarker(TrainerHook):
    """The last hook of the run (extra hooks follow the instruments): the counter counts for a step
    from its start to after every hook's `on_step_end`, the loss watch's reads included."""

    def __init__(self, mode: CountReads) -> None:
        self.mode = mode

    def on_step_start(self, step: int) -> None:
        self.mode.step = step

    def on_step_end(self, record: StepRecord) -> None:
        self.mode.step = -1


def _reads_per_step(tmp_path: Path, *overrides: str) -> CountReads:
    mode = CountReads()
    with mode:
        run_dir = tiny_run(tmp_path, "train.steps=6", *overrides, hooks=(StepMarker(mode),))
    assert (run_dir / "steps.parquet").exists()
    return mode


def test_a_default_step_reads_no_device_value(tmp_path: Path) -> None:
    mode = _reads_per_step(tmp_path)  # every instrument on, the trace window included
    assert {s: mode.what[s] for s in range(6) if mode.reads[s]} == {}


def test_the_nan_guard_pays_exactly_its_one_read(tmp_path: Path) -> None:
    mode = _reads_per_step(tmp_path, "switches.stability.nan_guard=skip")
    assert [mode.reads[s] for s in range(6)] == [1] * 6
