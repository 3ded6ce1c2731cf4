"""Dynamic batch size: a latency-target controller, or the largest batch that fits memory (000 2.5).

latency: the source's controller (shrink the batch when a step took longer than the target,
grow it otherwise, within [min_batch, max_batch]) as a `BatchController` the trainer asks after
every step. It trades throughput for a bound on step time; it does not raise throughput by
itself (the source's 4,200 -> 6,750 samples/s is a serving figure, where a batch waits for
requests; a training step always has its data). The batch oscillates around the size whose step
takes the target, and with loader workers a change reaches the trainer only after the batches
already prefetched.

fit: before training, the largest micro-batch whose measured peak memory stays under
(1 - fit_margin) x the budget, found by trying real forward+backward passes (doubling, then a
binary search), then fixed for the run. On CUDA the peak is the caching allocator's
(`max_memory_allocated`); on CPU there is no allocator peak to read, so it is a measured count
of the tensors a step holds (see `measure_peak_bytes`).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import psutil

from optimizers.base import Optimization, SetupContext, Switches, TrainSetup
from optimizers.config import MAX_BATCH, Section
from optimizers.facts import Candidate, Effect
from optimizers.vocabulary import Bottleneck

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class DynamicBatchConfig(Section):
    KEY: ClassVar[str] = "switches.dynamic_batch"
    mode: str = "off"
    """off; latency (shrink the batch when a step exceeds the target, grow it otherwise);
    fit (the largest batch whose measured peak memory fits the budget, found by trying)."""
    target_latency_ms: float = 500.0
    min_batch: int = 1
    max_batch: int = 64
    shrink_step: int = 2
    grow_step: int = 1
    fit_margin: float = 0.1
    """fit only: share of the memory budget kept free as a safety margin."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "latency", "fit"])
        self.check_range("target_latency_ms", lo=0.0, hi=3_600_000.0, lo_open=True)
        self.check_range("min_batch", lo=1, hi=MAX_BATCH)
        self.check_range("max_batch", lo=self.min_batch, hi=MAX_BATCH)
        self.check_range("shrink_step", lo=1, hi=MAX_BATCH)
        self.check_range("grow_step", lo=1, hi=MAX_BATCH)
        self.check_range("fit_margin", lo=0.0, hi=1.0, hi_open=True)

log = logging.getLogger("glmperf.optimizers")


class LatencyController:
    """Shrink by `shrink_step` after a step slower than the target, grow by `grow_step` otherwise."""

    def __init__(self, *, batch_size: int, target_s: float, min_batch: int, max_batch: int,
                 shrink_step: int, grow_step: int) -> None:
        self.target_s, self.min_batch, self.max_batch = target_s, min_batch, max_batch
        self.shrink_step, self.grow_step = shrink_step, grow_step
        self.batch_size = min(max(batch_size, min_batch), max_batch)

    def observe(self, step_time_s: float, peak_memory_bytes: int | None) -> int:
        if step_time_s > self.target_s:
            self.batch_size = max(self.batch_size - self.shrink_step, self.min_batch)
        else:
            self.batch_size = min(self.batch_size + self.grow_step, self.max_batch)
        return self.batch_size


class FixedBatch:
    """The batch the fit finder chose, for the whole run."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size

    def observe(self, step_time_s: float, peak_memory_bytes: int | None) -> int:
        return self.batch_size


def find_fitting_batch(trial: Callable[[int], int], *, budget_bytes: int, margin: float,
                       lo: int, hi: int) -> int:
    """The largest batch in [lo, hi] whose `trial(batch)` peak bytes stay under (1 - margin) x budget.

    Doubles from lo until a batch does not fit (or hi), then binary-searches between the last
    batch that fit and the first that did not, so the answer's next size up was tried and did not
    fit (unless the answer is hi). An out-of-memory error in a trial counts as not fitting.
    Assumes the peak grows with the batch. Raises RuntimeError when even lo does not fit.
    """
    import torch

    limit = (1.0 - margin) * budget_bytes

    def fits(batch: int) -> bool:
        try:
            peak = trial(batch)
        except (torch.cuda.OutOfMemoryError, MemoryError):  # torch.OutOfMemoryError only from torch 2.5
            log.info("dynamic_batch: batch %d ran out of memory", batch)
            return False
        log.info("dynamic_batch: batch %d peaks at %.3f GiB (limit %.3f GiB)",
                 batch, peak / 2**30, limit / 2**30)
        return peak <= limit

    if not fits(lo):
        raise RuntimeError(f"dynamic_batch fit: even batch {lo} exceeds {limit / 2**30:.3f} GiB "
                           f"((1 - {margin}) x a {budget_bytes / 2**30:.3f} GiB budget)")
    good = lo
    while good < hi:
        bad = min(2 * good, hi)
        if not fits(bad):
            break
        good = bad
    else:
        return good
    while bad - good > 1:  # invariant: good fits, bad does not
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        storage = t.untyped_storage()
    except (NotImplementedError, RuntimeError):  # tensor subclasses without a plain storage
        return None
    return storage.data_ptr(), storage.nbytes()


def measure_peak_bytes(model: nn.Module, batch_size: int, seq_len: int, vocab: int, device: torch.device,
                       autocast_dtype: torch.dtype | None, *, optimizer_state_factor: float = 2.0,
                       attention_mask: bool = False) -> int:
    """Peak bytes of one training micro-step at `batch_size`: a real forward+backward on random tokens.

    The optimizer's state is not allocated before the first step, so optimizer_state_factor x the
    parameter bytes is added (2: AdamW's exp_avg and exp_avg_sq). On CUDA the rest is the
    allocator's peak (`max_memory_allocated`, which counts params, grads, activations and
    transients). On CPU it is a count, not the allocator's peak: parameter + gradient bytes, the
    distinct storages saved for backward (seen through `saved_tensors_hooks`) and the logits;
    transients that live only inside one op are not seen. `attention_mask` passes a bool
    (B, 1, T, T) mask, as blank infilling does, because masked attention takes other kernels.
    Gradients are freed afterwards; the global RNG is not touched.
    """
    import torch

    gen = torch.Generator().manual_seed(batch_size)
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=gen).to(device)
    kwargs = {}
    if attention_mask:
        kwargs["attention_mask"] = torch.ones(batch_size, 1, seq_len, seq_len, dtype=torch.bool,
                                              device=device).tril()
    params = list({id(p): p for p in model.parameters()}.values())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    trainable_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    state_bytes = int(optimizer_state_factor * trainable_bytes)
    model.zero_grad(set_to_none=True)
    gc.collect()
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            with torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = model(ids, labels=ids, **kwargs).loss
            loss.backward()
            torch.cuda.synchronize(device)
            return torch.cuda.max_memory_allocated(device) + state_bytes
        own = {_storage_key(p) for p in params}
        saved: dict[tuple[int, int], int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = _storage_key(t)
            if key is not None and key not in own:
                saved[key] = key[1]
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast(
                device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = model(ids, labels=ids, **kwargs)
        logits_key = _storage_key(out.logits)
        logits_bytes = 0 if logits_key is None or logits_key in saved else logits_key[1]
        out.loss.backward()
        grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
        return param_bytes + grad_bytes + state_bytes + sum(saved.values()) + logits_bytes
    finally:
        model.zero_grad(set_to_none=True)


def memory_budget(ctx: SetupContext) -> int:
    """ctx.memory_budget_bytes, else the device's total memory (CUDA) or the machine's RAM (CPU)."""
    import torch

    if ctx.memory_budget_bytes:
        return ctx.memory_budget_bytes
    if ctx.device.type == "cuda":
        return torch.cuda.get_device_properties(ctx.device).total_memory
    return psutil.virtual_memory().total


def _vocab(model: nn.Module) -> int:
    """Token ids must index the input embedding: the first nn.Embedding's size."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    raise TypeError(f"{type(model).__name__} has no nn.Embedding; dynamic_batch fit cannot make inputs")


def _agree_across_ranks(batch: int, device: torch.device) -> int:
    """Under DDP every rank must run the same batch: the smallest any rank found."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return batch
    found = torch.tensor([batch], device=device)
    torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MIN)
    return int(found.item())


def apply_dynamic_batch(setup: TrainSetup, cfg: DynamicBatchConfig, ctx: SetupContext) -> None:
    if cfg.mode == "latency":
        setup.batch_controller = LatencyController(
            batch_size=ctx.batch_size, target_s=cfg.target_latency_ms / 1000, min_batch=cfg.min_batch,
            max_batch=cfg.max_batch, shrink_step=cfg.shrink_step, grow_step=cfg.grow_step)
        setup.note("dynamic_batch", f"latency target {cfg.target_latency_ms:g} ms: batch starts at "
                                    f"{setup.batch_controller.batch_size}, -{cfg.shrink_step}/"
                                    f"+{cfg.grow_step} within [{cfg.min_batch}, {cfg.max_batch}]")
        return
    model, budget = setup.raw_model, memory_budget(ctx)
    seq_len = ctx.seq_len
    vocab = _vocab(model)

    def trial(batch: int) -> int:
        return measure_peak_bytes(model, batch, seq_len, vocab, ctx.device, setup.autocast_dtype,
                                  attention_mask=ctx.objective == "blank_infilling")

    found = find_fitting_batch(trial, budget_bytes=budget, margin=cfg.fit_margin,
                               lo=cfg.min_batch, hi=cfg.max_batch)
    found = _agree_across_ranks(found, ctx.device)
    setup.batch_controller = FixedBatch(found)
    how = "allocator peak" if ctx.device.type == "cuda" else "counted tensor bytes (CPU)"
    setup.note("dynamic_batch", f"fit: batch {found} (of [{cfg.min_batch}, {cfg.max_batch}]) is the largest "
                                f"under {1 - cfg.fit_margin:.0%} of {budget / 2**30:.2f} GiB ({how})")


def _check_world(switches: Switches, ctx: SetupContext) -> str | None:
    if switches.dynamic_batch.mode == "latency" and ctx.world_size > 1:
        return ("latency mode decides from each rank's own step time, so ranks would drift to different "
                "batches that DDP averages as if equal; use mode=fit (ranks agree on one batch) or one rank")
    return None


_FULLER = ("grad_accumulation=4, batch 2 row, read backwards: micro-batches of 8 instead of 2 ran forward "
           "17% and backward 11% faster per token; nothing once the device is full")

OPTIMIZATION = Optimization(
    name="dynamic_batch",
    config=DynamicBatchConfig,
    apply=apply_dynamic_batch,
    enabled=lambda c: c.mode != "off",
    addresses=(Bottleneck.MEMORY_BOUND,),
    effect="fit: the largest micro-batch that fits memory, found by measurement instead of guessed "
           "(fewer, fuller steps); latency: keeps the step time near a target.",
    cost="fit: a few trial forward+backward passes at setup; latency: none per step, but smaller batches "
         "lower throughput whenever the target binds.",
    risk="a changing batch changes the gradient noise and the effective lr; with compile each new batch "
         "size can recompile; fit's margin must cover fragmentation and peaks the trials did not see.",
    source="000 2.5",
    checks=(_check_world,),
    # fit only: the latency controller bounds step time, it does not raise throughput
    # (dynamic_batch=latency row: tokens/s +1%, the source's +60% is a serving figure)
    candidates=(
        Candidate(set={"switches.dynamic_batch.mode": "fit"}, applies=lambda c: c.mode == "off",
                  risk="convergence",
                  effects=(Effect("forward", "shrinks", 0.0, 0.15, basis=_FULLER),
                           Effect("backward", "shrinks", 0.0, 0.1, basis=_FULLER)),
                  note="the largest micro-batch under (1 - fit_margin) x the memory budget: larger where "
                       "memory was left unused, smaller where the run was about to run out"),
    ),
)
