"""What-if probes on one's own model, at the end of its training: a change measured on the model, a batch
of the run and its loss, side by side with the run's own setting, in the training process (the only
place the model is).

The framework callbacks keep the first training batch and know its loss (Hugging Face: the model's
`loss` output; Lightning: `training_step`). At the train end `probe_own` times that batch's forward and
backward with the run's autocast and with each change, in ABBA rounds as profiler.advice.probes does for
the reference trainer, and returns each as a Probe (seconds per token by phase), which the callback
stores in run.json `own_probes`; profiler.advice.framework turns them into measured ranges through the
run's breakdown. Nothing steps the optimizer; the gradients and the RNG state are put back as they were.
What is probed: the autocast dtype (bf16 for an fp32 run where bf16 is native; none for a low-precision
one). The rounds stop as a reference probe's do, or, after two, when `budget_s` (profile.probe_budget_s)
is spent.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

from profiler.advice.probes import MAX_ROUNDS, MIN_ROUNDS, RELATIVE_WIDTH, Probe, interval_width
from profiler.analysis.environment import NATIVE_BF16_FLAGS
from profiler.instruments.machine import cpu_flags, device_name
from profiler.metrics import PHASE_NAMES

LossOf = Callable[[], torch.Tensor]
"""The loss of the kept batch, computed by the model (a forward)."""
DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def changes_for(amp: str, device: torch.device) -> list[str]:
    """The autocast dtypes to probe against a run's `amp`: bf16 for fp32 matmuls where the device runs bf16
    natively (emulated, it is never advised, and slow to measure), fp32 for low precision."""
    if amp != "off":
        return ["off"] if amp in DTYPES else []
    native = torch.cuda.is_bf16_supported() if device.type == "cuda" else bool(NATIVE_BF16_FLAGS & set(cpu_flags()))
    return ["bf16"] if native else []


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(loss_of: LossOf, model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None,
           tokens: int) -> dict[str, float]:
    """One forward and backward of the batch under `dtype` (None: fp32): seconds per token by phase."""
    _sync(device)
    t0 = time.perf_counter()
    with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = loss_of()
    _sync(device)
    t1 = time.perf_counter()
    loss.backward()
    _sync(device)
    t2 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    return {p: 0.0 for p in PHASE_NAMES} | {"forward": (t1 - t0) / tokens, "backward": (t2 - t1) / tokens}


@contextlib.contextmanager
def _untouched(model: torch.nn.Module) -> Iterator[None]:
    """The model's gradients and the RNG state as they were, whatever the probe did."""
    grads = {p: p.grad for p in model.parameters()}
    model.zero_grad(set_to_none=True)  # else the first backward adds into the kept gradients
    rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        for p, g in grads.items():
            p.grad = g
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def probe_own(model: torch.nn.Module, loss_of: LossOf, *, tokens: int, device: torch.device, amp: str,
              budget_s: float) -> list[Probe]:
    """Each change of `changes_for(amp)` measured against the run's `amp` on the kept batch, within
    about `budget_s` seconds in all; [] when nothing applies or the budget is 0."""
    out: list[Probe] = []
    started = time.perf_counter()
    with _untouched(model):
        for change in changes_for(amp, device) if budget_s > 0 and tokens > 0 else []:
            base_dtype, cand_dtype = DTYPES[amp], DTYPES[change]
            probe = Probe(change={"switches.amp.dtype": change}, machine=device_name(device),
                          threads=torch.get_num_threads())
            for dtype in (base_dtype, cand_dtype):  # first calls: kernels chosen, caches filled
                _timed(loss_of, model, device, dtype, tokens)
            probe.stopped = f"{MAX_ROUNDS} rounds"
            for i in range(MAX_ROUNDS):
                if i % 2 == 0:
                    probe.base.append(_timed(loss_of, model, device, base_dtype, tokens))
                probe.cand.append(_timed(loss_of, model, device, cand_dtype, tokens))
                if i % 2 == 1:
                    probe.base.append(_timed(loss_of, model, device, base_dtype, tokens))
                spent = time.perf_counter() - started
                if probe.rounds >= MIN_ROUNDS and interval_width(probe.step_ratios()) < RELATIVE_WIDTH:
                    probe.stopped = f"the step ratio's 90% interval is within {RELATIVE_WIDTH:.0%}"
                    break
                if spent + spent / (i + 2) > budget_s and probe.rounds >= 2:
                    probe.stopped = "the probe's time was spent"
                    break
            probe.cost_s = time.perf_counter() - started
            probe.measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            out.append(probe)
    return out
