"""Every switch against its baseline on the `small` preset, in one process, steps interleaved.

Each row is a `reference_model.trainer.Trainer` built with one switch on. All trainers are built
first, then driven one optimizer step each in turn (the trainer's own `run_step`,
exactly what `fit()` runs, so hooks, post-step hooks and the batch controller all act), and a
`TrainerHook` records every step's wall time (`StepRecord.wall_s`), phase times and loss. Speed is
the median over steady steps of the per-step ratio to the row's reference, measured side by side.

Memory on CPU has no allocator peak to read, so it is a TENSOR COUNT, not a peak: the distinct
storages saved for backward during one forward of the row's micro-batch (seen through
`torch.autograd.graph.saved_tensors_hooks`, plus the inputs a checkpointed block keeps, which its
own hooks hide), and the parameter + gradient + optimizer-state bytes (+ pruning masks).
Transients that live inside one operator (e.g. the attention scores of a fused kernel) are not
counted.

Every row states the source documents' claim next to the measurement and a verdict that says
plainly where they disagree and why.

    python -m benchmarks.switch_effects            # full: 25 steps (5 warmup) per row (~4-5 min, 2 cores)
    python -m benchmarks.switch_effects --quick    # 8 steps (3 warmup), compile skipped (~1 min)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.common import fmt, header, median, mode_label, table, write_result
from optimizers.catalog import REGISTRY
from optimizers.config import SwitchesConfig, build_section
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.trainer import StepRecord, Trainer, TrainerHook

SEQ, BATCH = 256, 8


@dataclass
class Row:
    name: str
    switches: dict[str, Any]
    ref: str = "baseline"
    """The row this one is compared with."""
    module: str = ""
    """optimizers.<module> the row needs (its switch name by default)."""
    batch_size: int = BATCH
    io_delay_ms: float = 0.0
    claim: str = "no figure claimed"
    verdict: Callable[[dict[str, float]], str] | None = None


# --------------------------------------------------------------------------------------------
# Verdicts: the measurement against the claim, in words. m holds the ratios to the reference row
# (time, tps, act, total, params, loss, flops, opt) and a few absolute figures.


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f}%"


def v_amp(m: dict[str, float]) -> str:
    mem = ("AGREES on memory" if m["total"] <= 0.7 else "DISAGREES on memory") + (
        f": total {_pct(m['total'])}, saved activations {_pct(m['act'])}; autocast keeps the fp32 weights, "
        "gradients and AdamW moments (16 bytes/param) and saves some tensors in both precisions (fp32 "
        "norm/softmax inputs, bf16 matmul inputs and bf16 weight copies)")
    speed = ("AGREES on speed" if m["time"] < 0.9 else "DISAGREES on speed") + f": step time {_pct(m['time'])}"
    if m["time"] >= 0.9:
        speed += (" (bf16 matmuls need AVX512-BF16 or AMX; without them, and for the many small ops, the "
                  "fp32<->bf16 casts cost more than they save)")
    return f"{mem}. {speed}"


def v_ckpt(full: bool) -> Callable[[dict[str, float]], str]:
    def verdict(m: dict[str, float]) -> str:
        figures = (f"total memory {_pct(m['total'])} (saved activations {_pct(m['act'])}), step time "
                   f"{_pct(m['time'])}")
        if not full:
            return (f"{figures}: checkpointing every 2nd block recomputes half the blocks, so expect about "
                    "half of full's saving and half its cost")
        mem_ok, time_ok = m["total"] <= 0.5, 1.15 <= m["time"] <= 1.4
        why = []
        if not mem_ok:
            why.append("the -60% holds only where activations dominate; here weights, grads and AdamW "
                       "state keep a large share, and the embedding, lm_head logits and fp32 log-softmax "
                       "run outside the blocks, where no block checkpoint reaches")
        if m["time"] < 1.15:
            why.append("recompute adds one block forward (~1/3 of the blocks' forward+backward) and the "
                       "lm_head and loss are not recomputed, so the cost lands below +33%")
        elif m["time"] > 1.4:
            why.append("more than one extra forward's worth: on a busy CPU the recompute also loses "
                       "cache locality")
        word = "AGREES" if mem_ok and time_ok else ("PARTLY" if mem_ok or time_ok else "DISAGREES")
        return f"{word}: {figures}" + ("; " + "; ".join(why) if why else "")
    return verdict


def v_accum(m: dict[str, float]) -> str:
    return (f"saved activations {_pct(m['act'])} (a micro-batch of 2 instead of 8: expect -75%), step time "
            f"{_pct(m['time'])} (4 smaller matmuls use the cores less well than one big one); "
            f"loss {_pct(m['loss'])} vs baseline: the same samples, 4 micro-batches of 2 instead of one batch of 8")


def v_compile(m: dict[str, float]) -> str:
    word = "AGREES" if m["time"] <= 0.8 else ("PARTLY" if m["time"] < 0.95 else "DISAGREES")
    return (f"{word}: step time {_pct(m['time'])}, saved activations {_pct(m['act'])} (inductor fuses the "
            "pointwise chains of RMSNorm, RoPE, SwiGLU and residuals; matmuls stay oneDNN calls, so the gain "
            "is bounded by the pointwise share of the step)")


def v_eager(m: dict[str, float]) -> str:
    return (f"step time {_pct(m['time'])}, saved activations {_pct(m['act'])}: eager materializes and saves "
            "the (B, H, T, T) scores and probabilities that sdpa's fused kernel never stores")


def v_linear(m: dict[str, float]) -> str:
    head = (f"step time {_pct(m['time'])} at T=256. The claim's O(L*D) is wrong: per head linear attention "
            "costs O(T*hd^2) (K^T V alone), vs softmax's O(T^2*hd), so at T=256, hd=64 it does 4x fewer "
            "attention FLOPs")
    if m["time"] > 1.0:
        return (f"DISAGREES on cost: {head}, but its chunk loop of small fp32 ops costs more than sdpa's one "
                "fused call; it wins only at T >> hd (see attention_scaling)")
    return (f"PARTLY: {head}, and attention is a small share of this model's step; the gain grows with T "
            f"(see attention_scaling). It changes the model: loss {_pct(m['loss'])}")


def v_sharing(m: dict[str, float]) -> str:
    return (f"DISAGREES on time: params {_pct(m['params'])} (claim -62%; the embedding and lm_head are not "
            f"shared), step time {_pct(m['time'])} (claim -40%). Sharing removes parameters, not compute: "
            f"every layer still runs its matmuls (model FLOPs per step {_pct(m['flops'])}); what it saves is "
            "the optimizer update of the removed parameters and cache misses on weights. The source's "
            "figures compare two different RNNs")


def v_unstructured(m: dict[str, float]) -> str:
    word = "DISAGREES" if m["time"] > 0.8 else "AGREES"
    return (f"{word}: step time {_pct(m['time'])} (claim -38%). Zeroed weights in dense matrices are "
            "multiplied like any other: dense GEMMs take no shortcut for zeros (and the masks add a "
            "gradient hook and a re-mask per step). The source's -38% is inference latency, needing "
            "sparse kernels; params are unchanged in count, 60% of FFN weights are zero")


def v_structured(m: dict[str, float]) -> str:
    return (f"step time {_pct(m['time'])} vs model FLOPs per step {_pct(m['flops'])}: removing half the FFN "
            "channels shrinks the matrices, so the time falls about with the FLOPs (params "
            f"{_pct(m['params'])}); a real speed-up, at the cost of capacity (loss {_pct(m['loss'])})")


def v_optimizer(m: dict[str, float]) -> str:
    figures = f"optimizer phase {_pct(m['opt'])}, step time {_pct(m['time'])}"
    if m["opt"] < 0.9:
        return (f"{figures}: the multi-tensor / fused kernels cut the per-parameter launches of the AdamW "
                "update; the whole step gains only the optimizer's small share of it at this size")
    return (f"{figures}: no gain here; with ~40 parameter tensors the per-tensor loop costs little on "
            "CPU, where there are no kernel launches to save")


def v_dynamic(m: dict[str, float]) -> str:
    word = "AGREES" if m["tps"] >= 1.5 else "DISAGREES"
    if m["batch_last"] < m["batch_first"]:
        how = ("the target binds (a step of 8 takes longer than 500 ms here), so the controller shrinks the "
               "batch and throughput can only fall: smaller matmuls use the cores less well")
    else:
        how = ("the target does not bind, so the controller grows the batch; any gain is that of a larger "
               "batch (better matmul efficiency), which a fixed larger batch gives too")
    return (f"{word}: tokens/s {_pct(m['tps'])} (claim +60%), batch {m['batch_path']}: {how}. A latency "
            "controller trades throughput for a bound on step time; the source's 4,200 -> 6,750 is a "
            "serving figure, where a batch waits for requests")


def v_workers(m: dict[str, float]) -> str:
    bound = m["delay_bound"]
    figures = (f"tokens/s {_pct(m['tps'])} (claim ~7x), data wait {m['ref_data_ms']:.0f} -> {m['data_ms']:.0f} "
               f"ms per step; workers hide at most the input time, so the ceiling here is "
               f"(step + 20 ms) / step = {bound:.2f}x")
    if m["tps"] >= 0.9 * bound:
        return f"DISAGREES with 7x, AGREES with that ceiling: {figures}; 7x needs an input-dominated step"
    return (f"DISAGREES: {figures}; below even that: the worker processes compete with the training threads "
            "for the cores")


def v_same_as_baseline(m: dict[str, float]) -> str:
    return (f"control: torch's auto picks the for-loop AdamW for CPU tensors, so this row IS the baseline; "
            f"its step time {_pct(m['time'])} is this run's noise level")


ROWS: list[Row] = [
    Row("baseline", {}, ref=""),
    Row("amp=bf16", {"amp": "bf16"}, module="amp",
        claim="-40% memory (004 2.5 table); fp16 halves memory traffic, raises throughput (000 2.2)",
        verdict=v_amp),
    Row("activation_checkpointing=full", {"activation_checkpointing": "full"},
        claim="-60% memory for +20-30% time (000 2.3; 004 2.5: ~60%)", verdict=v_ckpt(True)),
    Row("activation_checkpointing=selective (every 2)",
        {"activation_checkpointing": {"mode": "selective", "every": 2}}, module="activation_checkpointing",
        claim="(full: -60% memory for +20-30% time, 000 2.3)", verdict=v_ckpt(False)),
    Row("grad_accumulation=4, batch 2", {"grad_accumulation": 4}, batch_size=2,
        claim="same as a 4x batch in less memory (004 3.2; 000 4.3); no speed figure", verdict=v_accum),
    Row("compile=default (scope block)", {"compile": "default"},
        claim="fused ops 120 -> 85 ms (-29%), 320 -> 260 MB (004 3.3)", verdict=v_compile),
    Row("attention=eager", {"attention": "eager"}, claim="(the unfused baseline; no figure)",
        verdict=v_eager),
    Row("attention=linear", {"attention": "linear"}, claim="O(L^2) -> O(L*D) cost (000 3.1)",
        verdict=v_linear),
    Row("param_sharing=all", {"param_sharing": "all"},
        claim="120M -> 45M params, 8.7 -> 5.2 s per epoch (-40% time) (000 3.2)", verdict=v_sharing),
    Row("ffn_pruning=unstructured 0.6", {"ffn_pruning": {"mode": "unstructured", "sparsity": 0.6}},
        claim="60% sparsity: 48.2 -> 29.7 ms (-38%), 25.3M -> 10.1M params (000 3.3)",
        verdict=v_unstructured),
    Row("ffn_pruning=structured 0.5", {"ffn_pruning": {"mode": "structured", "sparsity": 0.5}},
        claim="(000 3.3's -38% is for 60% unstructured; no structured figure)", verdict=v_structured),
    Row("optimizer impl=forloop", {"optimizer": {"impl": "forloop"}}, module="optim",
        claim="no figure (000 4.1 / 004 4.3 name optimizers only)", verdict=v_same_as_baseline),
    Row("optimizer impl=foreach", {"optimizer": {"impl": "foreach"}}, ref="optimizer impl=forloop",
        module="optim", claim="no figure", verdict=v_optimizer),
    Row("optimizer impl=fused", {"optimizer": {"impl": "fused"}}, ref="optimizer impl=forloop",
        module="optim", claim="no figure", verdict=v_optimizer),
    Row("dynamic_batch=latency (target 500 ms)", {"dynamic_batch": {"mode": "latency",
                                                                     "target_latency_ms": 500.0}},
        claim="fixed 32 -> dynamic: 4,200 -> 6,750 items/s (+60%) (000 2.5)", verdict=v_dynamic),
    Row("io_delay 20 ms, workers 0", {}, io_delay_ms=20.0, module="dataloader",
        claim="(reference for the workers row)"),
    Row("io_delay 20 ms, dataloader workers 2", {"dataloader": {"num_workers": 2}},
        ref="io_delay 20 ms, workers 0", io_delay_ms=20.0,
        claim="parallel prefetch ~7x throughput (000 4.2)", verdict=v_workers),
]


# --------------------------------------------------------------------------------------------
# Recording


class Recorder(TrainerHook):
    """Per-step wall time, loss, batch and phase times (phases summed over micro-batches)."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.phases: list[dict[str, float]] = []
        self._open: dict[str, float] = {}
        self._current: dict[str, float] = {}

    def on_step_start(self, step: int) -> None:
        self._current = {}

    def on_phase_start(self, step: int, phase: str) -> None:
        self._open[phase] = time.perf_counter()

    def on_phase_end(self, step: int, phase: str) -> None:
        dt = time.perf_counter() - self._open.pop(phase)
        self._current[phase] = self._current.get(phase, 0.0) + dt

    def on_step_end(self, record: StepRecord) -> None:
        self.records.append(record)
        self.phases.append(self._current)


@dataclass
class Live:
    row: Row
    trainer: Trainer
    recorder: Recorder
    batches: Any
    step: int = 0

    def run_step(self) -> None:
        # what Trainer.fit() does per step (fit() itself runs all steps of one trainer at once)
        self.trainer.run_step(self.step, self.batches)
        self.step += 1


def availability(row: Row) -> str | None:
    """Why the row cannot run here, or None."""
    module = row.module or next(iter(row.switches), "")
    if module and importlib.util.find_spec(f"optimizers.{module}") is None:
        return f"not available: optimizers/{module}.py does not exist yet"
    for name in row.switches:
        if name not in REGISTRY.names():
            return f"not available: switch {name!r} is not registered (its module failed to import)"
    return None


def build(row: Row, steps: int, corpus: str) -> Live:
    switches = build_section(SwitchesConfig, row.switches, "switches")
    rec = Recorder()
    trainer = Trainer(model_cfg=model_config("small"),
                      data_cfg=DataConfig(corpus=[corpus], seq_len=SEQ, io_delay_ms=row.io_delay_ms),
                      train_cfg=TrainConfig(batch_size=row.batch_size, steps=steps, device="cpu"),
                      switches=switches, hooks=[rec])
    return Live(row, trainer, rec, iter(trainer.loader))


# --------------------------------------------------------------------------------------------
# Memory: a tensor count (CPU has no allocator peak)


def _key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        s = t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return None
    return s.data_ptr(), s.nbytes()


def memory_count(live: Live) -> dict[str, float]:
    """Bytes of: saved activations of one forward (micro-batch), params, grads, optimizer state, masks."""
    from optimizers.activation_checkpointing import is_checkpointed

    t = live.trainer
    s = t.setup
    model: nn.Module = s.raw_model
    params = list({id(p): p for p in model.parameters()}.values())
    own = {_key(p) for p in params}
    saved: dict[tuple[int, int], int] = {}

    def note(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            k = _key(x)
            if k is not None and k not in own:
                saved[k] = k[1]

    def pack(x: torch.Tensor) -> torch.Tensor:
        note(x)
        return x

    def note_inputs(_module: nn.Module, inputs: tuple[Any, ...]) -> None:
        for x in inputs:
            note(x)

    # a checkpointed block keeps its inputs for the recompute, hidden from outer hooks by its own
    handles = [b.register_forward_pre_hook(note_inputs)
               for b in {id(b): b for b in model.blocks}.values() if is_checkpointed(b)]
    B = live.row.batch_size
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (B, SEQ), generator=gen)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), torch.autocast(
                "cpu", dtype=s.autocast_dtype, enabled=s.autocast_dtype is not None):
            out = s.model(ids, labels=ids)
        out.loss.backward()
    finally:
        for h in handles:
            h.remove()
        s.optimizer.zero_grad(set_to_none=True)
    param_b = sum(p.numel() * p.element_size() for p in params)
    grad_b = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    opt_b = sum(v.numel() * v.element_size() for st in s.optimizer.state.values()
                for v in st.values() if isinstance(v, torch.Tensor))
    mask_b = sum(m.numel() * m.element_size() for h in s.post_step_hooks for _, m in getattr(h, "pairs", []))
    act = float(sum(saved.values()))
    return {"act": act, "param_b": param_b, "grad_b": grad_b, "opt_b": opt_b, "mask_b": mask_b,
            "total": act + param_b + grad_b + opt_b + mask_b}


# --------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> str:
    steps, warmup = args.steps, args.warmup
    rows = [r for r in ROWS if not args.rows or r.name in args.rows or r.name == "baseline"
            or any(r.name == x.ref for x in ROWS if x.name in args.rows)]
    if args.quick and not args.rows:
        rows = [r for r in rows if not r.switches.get("compile")]
    lives: dict[str, Live] = {}
    missing: dict[str, str] = {}
    for row in rows:
        reason = availability(row)
        if reason is None:
            try:
                print(f"building {row.name} ...", file=sys.stderr, flush=True)
                lives[row.name] = build(row, steps, args.corpus)
            except Exception as exc:  # a switch's check refused it here: report, don't crash
                reason = f"not available: {type(exc).__name__}: {exc}"
        if reason:
            missing[row.name] = reason
            print(f"  {row.name}: {reason}", file=sys.stderr)
    order = list(lives)
    for step in range(steps):
        shift = step % len(order)
        for name in order[shift:] + order[:shift]:
            lives[name].run_step()
        print(f"  step {step + 1}/{steps}: " + ", ".join(
            f"{n.split(' ')[0]} {lives[n].recorder.records[-1].wall_s * 1e3:.0f}" for n in order),
            file=sys.stderr, flush=True)

    figures: dict[str, dict[str, Any]] = {}
    for name, live in lives.items():
        recs = live.recorder.records
        steady = recs[warmup:]
        wall = [r.wall_s for r in steady]
        tokens = [r.tokens for r in steady]
        f: dict[str, Any] = {
            "wall": wall, "step_ms": median(wall) * 1e3, "tps": sum(tokens) / sum(wall),
            "loss": sum(float(r.loss) for r in recs[-3:]) / 3,
            "params": live.trainer.setup.raw_model.num_params(),
            "flops": live.trainer.flops_per_token * median(tokens),
            "opt": [p.get("optimizer", 0.0) for p in live.recorder.phases[warmup:]],
            "phases": {ph: median([p.get(ph, 0.0) for p in live.recorder.phases[warmup:]]) * 1e3
                       for ph in ("data", "forward", "backward", "optimizer")},
            "batches": [r.batch_size for r in recs],
        }
        if live.trainer.setup.compiled:
            f["compile_s"] = recs[0].wall_s - median(wall)
        try:
            f.update(memory_count(live))
        except Exception as exc:  # e.g. a compiled graph that refuses saved-tensor hooks
            f["mem_error"] = f"{type(exc).__name__}: {exc}"
        figures[name] = f

    main_rows, abs_rows = [], []
    for row in rows:
        if row.name in missing:
            main_rows.append([row.name, row.ref or "-", *["n/a"] * 7, row.claim, missing[row.name]])
            continue
        f = figures[row.name]
        mb = f.get("total", float("nan")) / 2**20
        notes = []
        if "compile_s" in f:
            notes.append(f"compile (first step minus a steady step) {f['compile_s']:.1f} s")
        if "mem_error" in f:
            notes.append(f"memory count failed: {f['mem_error']}")
        if len(set(f["batches"])) > 1:
            notes.append("batch " + "->".join(str(b) for b in f["batches"]))
        abs_rows.append([row.name, fmt(f["step_ms"], ".0f"), fmt(f["tps"], ".0f"),
                         " / ".join(fmt(f["phases"][p], ".0f") for p in ("data", "forward", "backward",
                                                                             "optimizer")),
                         fmt(f.get("act", float("nan")) / 2**20, ".1f"), fmt(mb, ".1f"),
                         f"{f['params']:,}", fmt(f["loss"], ".3f"), "; ".join(notes)])
        if not row.ref:
            main_rows.append([row.name, "-", "1", "1", "1", "1", "1", "1", "1", row.claim, "reference"])
            continue
        if row.ref not in figures:
            main_rows.append([row.name, row.ref, *["n/a"] * 7, row.claim, f"reference {row.ref} not run"])
            continue
        r = figures[row.ref]
        m: dict[str, Any] = {
            "time": f["step_ms"] / r["step_ms"], "tps": f["tps"] / r["tps"],
            "act": f.get("act", float("nan")) / r.get("act", float("nan")),
            "total": f.get("total", float("nan")) / r.get("total", float("nan")),
            "params": f["params"] / r["params"], "loss": f["loss"] / r["loss"],
            "flops": f["flops"] / r["flops"],
            "opt": median(f["opt"]) / median(r["opt"]) if median(r["opt"]) > 0 else float("nan"),
            "batch_path": f"{f['batches'][0]} -> {f['batches'][-1]} (min {min(f['batches'])}, "
                          f"max {max(f['batches'])})",
            "batch_first": f["batches"][0], "batch_last": f["batches"][-1],
            "data_ms": f["phases"]["data"], "ref_data_ms": r["phases"]["data"],
            "delay_bound": r["step_ms"] / max(r["step_ms"] - 20.0, 1e-9),
        }
        verdict = row.verdict(m) if row.verdict else ""
        main_rows.append([row.name, row.ref, f"{m['time']:.2f}", f"{m['tps']:.2f}", fmt(m["act"]),
                          fmt(m["total"]), f"{m['params']:.2f}", f"{m['loss']:.3f}", f"{m['flops']:.2f}",
                          row.claim, verdict])

    mode = args.mode
    out = header("Switch effects on the `small` preset (CPU)")
    out += (f"- mode: {mode}; {steps} optimizer steps per row, the first {warmup} left out; every row's "
            "steps interleaved with every other row's (one step each in turn)\n"
            f"- model: `small` preset (hidden 256, 4 layers, 4 heads, 2 KV, head_dim 64, FFN 688, vocab 320); "
            f"seq {SEQ}, batch {BATCH}; corpus {args.corpus}; baseline switches: sdpa, AdamW (impl auto), "
            "cosine lr, clip 1.0, fp32\n"
            "- ratios are row / reference: step time = ratio of the median step times; tokens/s = total tokens / "
            "total time; memory figures are a TENSOR COUNT, not an allocator peak: activations = distinct "
            "storages saved for backward by one forward of the row's micro-batch (+ checkpointed blocks' "
            "inputs); total = activations + params + grads + optimizer state (+ pruning masks); "
            "loss = mean of the last 3 steps; FLOPs = model FLOPs per step (PaLM 6N + 12LHQT; counts "
            "dense FFN for unstructured pruning and softmax attention for linear)\n\n")
    out += table(["row", "vs", "step time x", "tokens/s x", "activations x", "total mem x", "params x",
                  "loss x", "FLOPs x", "source claim", "verdict"], main_rows)
    out += "\n#### Absolute figures\n\n"
    out += table(["row", "ms/step (median)", "tokens/s", "phase ms: data / fwd / bwd / optimizer",
                  "activations MiB", "total MiB (count)", "params", "loss (last 3)", "notes"], abs_rows)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 steps (3 warmup), no compile row")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--corpus", default="stdlib", help="stdlib (real text: losses mean something) or synthetic")
    p.add_argument("--rows", nargs="+", default=None, help="only these rows (+ baseline and their references)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.mode = mode_label(args, ["steps", "warmup", "rows"])
    args.steps = args.steps or (8 if args.quick else 25)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    write_result("switch_effects", run(args))


if __name__ == "__main__":
    main()
