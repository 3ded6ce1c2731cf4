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
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.common import fmt, header, median, mode_label, table, write_result
from benchmarks.switch_claims import BATCH, ROWS, SEQ, Row
from optimizers import REGISTRY, SwitchesConfig
from optimizers.config import build_section
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.trainer import Trainer

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
