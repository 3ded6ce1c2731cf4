"""Our trainer's step against Hugging Face `GlmForCausalLM` on the same config, weights and batches.

Both sides run the identical step: zero_grad(set_to_none), forward (under bf16 autocast for the
bf16 rows), loss, backward, clip_grad_norm 1.0, AdamW step (same param groups and settings, built
by optimizers.optim.build_optimizer), LR schedule step. Ours is `reference_model.trainer.Trainer
.train_step` itself (sdpa attention, the baseline switches); theirs is the same loop written out
around `transformers.GlmForCausalLM(attn_implementation="sdpa", use_cache=False)`. The weights are
copied from ours, the batches are the same `torch.randint` tokens, and the losses are the same
function: HF shifts its labels inside, so it gets `labels = input_ids`, and ours gets the aligned
labels with the last position set to -100 (the one target HF cannot see), so both average the same
B*(T-1) cross-entropies. The step-0 losses are compared as a parity check.

One process, one step of each in turn (interleaved), medians over the steady rounds after warmup;
the speed figure is the median over rounds of the per-round ratio. MFU divides the model FLOPs
(PaLM appendix B, `GLMForCausalLM.flops_per_token`) by this CPU's matmul peak as the profiler measures
it (`profiler.instruments.machine.calibrate`), so the figure is comparable with a profiled run's MFU.

    python -m benchmarks.peer_hf_glm            # full: shapes A and B, fp32 and bf16 (~6-7 min, 2 cores)
    python -m benchmarks.peer_hf_glm --quick    # shape A only, few rounds (~1 min)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import (
    add_machine_args,
    apply_machine_args,
    fmt,
    header,
    interleaved,
    median,
    mode_label,
    paired_ratio,
    table,
    write_result,
)
from optimizers import SwitchesConfig
from optimizers.config import build_section
from optimizers.optim import LrScheduleConfig, OptimizerConfig, build_optimizer, lr_factor
from profiler.instruments.machine import calibrate
from reference_model.config import DataConfig, GLMConfig, TrainConfig, model_config
from reference_model.hf import to_hf_config
from reference_model.model import IGNORE_INDEX, GLMForCausalLM
from reference_model.trainer import Trainer

SHAPES: dict[str, dict[str, int]] = {
    "A": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=64, intermediate_size=688, vocab_size=8192, seq_len=256, batch_size=8),
    "B": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
              head_dim=64, intermediate_size=1376, vocab_size=32000, seq_len=512, batch_size=4),
}
LR = 3e-4
CLIP = 1.0
HORIZON = 10_000
"""The schedule's total steps: long, so both sides run at a near-constant lr through the benchmark."""


def make_batches(vocab: int, batch: int, seq: int, n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """n random-token windows of seq+1 tokens: ours gets aligned labels, HF gets labels = input_ids."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        w = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
        ids = w[:, :-1].contiguous()
        labels = w[:, 1:].clone()
        labels[:, -1] = IGNORE_INDEX  # HF's shift drops the last position's target: drop it here too
        out.append({"input_ids": ids, "labels": labels})
    return out


class PlainStep:
    """The step of Trainer.train_step written out around any model: the HF side, and (--bare) ours
    without the Trainer, which separates loop overhead from model speed."""

    def __init__(self, model: torch.nn.Module, autocast: torch.dtype | None) -> None:
        self.model = model.train()
        self.optimizer = build_optimizer(model, OptimizerConfig(), LR)
        sched = LrScheduleConfig()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(sched, s, HORIZON))
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.autocast = autocast
        self.last_loss = float("nan")

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=self.autocast, enabled=self.autocast is not None):
            loss = self.loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, CLIP)
        self.optimizer.step()
        self.scheduler.step()
        self.last_loss = float(loss.detach())


class HFStep(PlainStep):
    def __init__(self, cfg: GLMConfig, state: dict[str, torch.Tensor], autocast: torch.dtype | None) -> None:
        from transformers import GlmForCausalLM

        model = GlmForCausalLM(to_hf_config(cfg, attn_implementation="sdpa", use_cache=False))
        model.load_state_dict(state, strict=True)
        assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
        super().__init__(model, autocast)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # HF shifts inside its loss: labels = input_ids scores logits[t] against input_ids[t + 1]
        return self.model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


class BareStep(PlainStep):
    def __init__(self, cfg: GLMConfig, state: dict[str, torch.Tensor], autocast: torch.dtype | None) -> None:
        model = GLMForCausalLM(cfg)
        model.load_state_dict(state, strict=True)
        super().__init__(model, autocast)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(batch["input_ids"], labels=batch["labels"]).loss


def build_trainer(cfg: GLMConfig, seq: int, batch: int, amp: str) -> Trainer:
    switches = build_section(SwitchesConfig, {"amp": "bf16" if amp == "bf16" else "off",
                                              "stability": {"clip_grad_norm": CLIP}}, "switches")
    return Trainer(model_cfg=cfg, data_cfg=DataConfig(corpus=["synthetic"], seq_len=seq),
                   train_cfg=TrainConfig(batch_size=batch, steps=HORIZON, lr=LR, device="cpu"),
                   switches=switches)


def variants(cfg: GLMConfig, seq: int, batch: int, amp: str, batches: list[dict[str, torch.Tensor]],
             bare: bool) -> tuple[dict[str, Callable[[], None]], dict[str, Callable[[], float]], Trainer]:
    """The step functions to interleave (each pulls its own next batch) and their last-loss readers."""
    autocast = torch.bfloat16 if amp == "bf16" else None
    trainer = build_trainer(cfg, seq, batch, amp)
    state = trainer.model.state_dict()
    hf = HFStep(cfg, state, autocast)
    ours_iter: Iterator[dict[str, torch.Tensor]] = iter(batches)
    ours_state: dict[str, Any] = {"step": 0, "loss": float("nan")}

    def ours() -> None:
        record = trainer.train_step(ours_state["step"], ours_iter)
        ours_state["step"] += 1
        ours_state["loss"] = float(record.loss)

    hf_iter = iter(batches)
    fns: dict[str, Callable[[], None]] = {"ours": ours, "hf": lambda: hf.step(next(hf_iter))}
    losses: dict[str, Callable[[], float]] = {"ours": lambda: ours_state["loss"], "hf": lambda: hf.last_loss}
    if bare:
        b = BareStep(cfg, state, autocast)
        bare_iter = iter(batches)
        fns["ours_bare"] = lambda: b.step(next(bare_iter))
        losses["ours_bare"] = lambda: b.last_loss
    return fns, losses, trainer


def loss_parity(fns: dict[str, Callable[[], None]], losses: dict[str, Callable[[], float]]) -> float:
    """Run step 0 of every variant and return the largest |loss - ours' loss| (same weights, batch)."""
    for fn in fns.values():
        fn()
    ref = losses["ours"]()
    return max(abs(losses[n]() - ref) for n in losses)


def profile_diff(fns: dict[str, Callable[[], None]], steps: int = 3, top: int = 15) -> str:
    """Per-op self CPU time of ours vs HF over `steps` steps each (alternating, each step under its
    own profiler), as a table sorted by the absolute difference: where a slower side loses its time."""
    acc: dict[str, dict[str, list[float]]] = {"ours": {}, "hf": {}}
    for _ in range(steps):
        for name in ("ours", "hf"):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fns[name]()
            for evt in prof.key_averages():
                slot = acc[name].setdefault(evt.key, [0.0, 0.0])
                slot[0] += evt.self_cpu_time_total / 1e3 / steps  # ms per step
                slot[1] += evt.count / steps
    ops = set(acc["ours"]) | set(acc["hf"])

    def get(side: str, op: str) -> list[float]:
        return acc[side].get(op, [0.0, 0.0])

    ranked = sorted(ops, key=lambda op: -abs(get("ours", op)[0] - get("hf", op)[0]))[:top]
    rows = [[op[:60], f"{get('ours', op)[1]:.0f}", f"{get('hf', op)[1]:.0f}", f"{get('ours', op)[0]:.1f}",
             f"{get('hf', op)[0]:.1f}", f"{get('ours', op)[0] - get('hf', op)[0]:+.1f}"] for op in ranked]
    totals = [sum(v[0] for v in acc[side].values()) for side in ("ours", "hf")]
    rows.append(["**total self CPU**", "", "", f"{totals[0]:.1f}", f"{totals[1]:.1f}",
                 f"{totals[0] - totals[1]:+.1f}"])
    return table(["op", "calls/step ours", "calls/step HF", "self ms/step ours", "self ms/step HF",
                  "ours - HF (ms)"], rows)


def measure_peaks(quick: bool) -> dict[str, tuple[float, str]]:
    """(FLOP/s, how it was measured) of fp32 and bf16 matmuls on this CPU, the profiler's way."""
    peaks = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        print(f"measuring the {name} matmul peak ...", file=sys.stderr, flush=True)
        found = calibrate(torch.device("cpu"), dtype, budget_s=1.0 if quick else 3.0)
        peaks[name] = (found["flops"], found["source"])
    return peaks


def run(args: argparse.Namespace) -> str:
    peaks = measure_peaks(args.quick)
    rows, profiles, mfu_at = [], [], []
    for shape in args.shapes:
        s = dict(SHAPES[shape])
        seq, batch = s.pop("seq_len"), s.pop("batch_size")
        cfg = model_config("small", **s)
        for amp in args.precisions:
            print(f"shape {shape}, {amp}: building ...", file=sys.stderr, flush=True)
            batches = make_batches(cfg.vocab_size, batch, seq, 1 + args.warmup + args.rounds + 4)
            fns, losses, trainer = variants(cfg, seq, batch, amp, batches, args.bare)
            parity = loss_parity(fns, losses)
            times = interleaved(fns, warmup=args.warmup, rounds=args.rounds, clock=args.clock)
            tokens = batch * seq
            fpt = trainer.model.flops_per_token(seq)
            ratio, lo, hi = paired_ratio(times["hf"], times["ours"])  # t_hf / t_ours = tok/s ours / HF
            row = [shape, amp if amp == "bf16" else "fp32 (eager)",
                   fmt(median(times["ours"]) * 1e3, ".0f"), fmt(median(times["hf"]) * 1e3, ".0f"),
                   fmt(tokens / median(times["ours"]), ".0f"), fmt(tokens / median(times["hf"]), ".0f"),
                   f"**{ratio:.3f}x** [{lo:.3f}, {hi:.3f}]",
                   "", "",  # MFU, filled in once the peak is measured again at the end
                   f"{parity:.1e}", f"{losses['ours']():.4f} / {losses['hf']():.4f}"]
            if args.bare:
                r, _, _ = paired_ratio(times["ours"], times["ours_bare"])
                row.append(f"{r:.3f}")
            rows.append(row)
            mfu_at.append((len(rows) - 1, amp, tokens * fpt / median(times["ours"]),
                           tokens * fpt / median(times["hf"])))
            if args.profile or ratio < 0.97:
                print("  profiling ...", file=sys.stderr, flush=True)
                profiles.append(f"#### shape {shape}, {amp}: ops whose self CPU time differs most, ours vs HF "
                                f"(3 profiled steps each, alternating; profiler overhead included)\n\n"
                                f"{profile_diff(fns)}")
            del fns, losses, trainer
    # the best of a measurement before and after the runs: a busy moment lowers one of them
    again = measure_peaks(args.quick)
    peaks = {k: max(peaks[k], again[k]) for k in peaks}
    for i, amp, ours_flops, hf_flops in mfu_at:
        peak = peaks["bf16" if amp == "bf16" else "fp32"][0]
        rows[i][7], rows[i][8] = (fmt(100 * f / peak, ".1f") + "%" for f in (ours_flops, hf_flops))
    headers = ["shape", "precision", "ours ms/step", "HF ms/step", "ours tok/s", "HF tok/s",
               "tok/s ours/HF (median of per-round ratios) [IQR]", "MFU ours", "MFU HF",
               "step-0 |loss diff|", "last loss ours / HF"]
    if args.bare:
        headers.append("Trainer.train_step / bare step time")
    clock = "process CPU time (--cpu-time)" if args.cpu_time else "wall time"
    mode = args.mode
    shapes_txt = "; ".join(
        f"{k}: hidden {v['hidden_size']}, {v['num_hidden_layers']} layers, {v['num_attention_heads']} heads, "
        f"{v['num_key_value_heads']} KV heads, head_dim {v['head_dim']}, FFN {v['intermediate_size']}, "
        f"vocab {v['vocab_size']}, seq {v['seq_len']}, batch {v['batch_size']}"
        for k, v in SHAPES.items() if k in args.shapes)
    out = header("Our trainer vs Hugging Face GlmForCausalLM: training step on CPU")
    out += (f"- mode: {mode}; {args.warmup} warmup + {args.rounds} measured interleaved rounds per row, timed "
            f"by {clock}\n"
            f"- shapes: {shapes_txt}\n"
            "- matmul peak (MFU denominator, the better of a measurement before and after the rows; an MFU "
            "over 100% means the machine was busy while the peak was measured): "
            f"fp32 {peaks['fp32'][0] / 1e9:.0f} GFLOP/s "
            f"({peaks['fp32'][1]}); "
            f"bf16 {peaks['bf16'][0] / 1e9:.0f} GFLOP/s ({peaks['bf16'][1]})\n"
            "- MFU: tokens/s x flops_per_token (6N + 12*L*H*Q*T, PaLM appendix B) / peak of the row's "
            "precision\n"
            "- step: zero_grad, forward (bf16 autocast in bf16 rows), loss over the same B*(T-1) targets, "
            "backward, clip 1.0, AdamW (wd 0.1 on matrices, betas 0.9/0.95), cosine-schedule step\n\n")
    out += table(headers, rows)
    out += ("\nA ratio above 1 means our trainer processes more tokens per second than HF on the same "
            "work. Step-0 |loss diff| is the parity check (same weights, same batch): ~1e-6 in fp32.\n")
    if profiles:
        out += "\n### Profiles\n\n" + "\n".join(profiles)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shape A only, 2 warmup + 4 rounds")
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=None)
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--bare", action="store_true", help="also time our model without the Trainer")
    p.add_argument("--profile", action="store_true", help="always add torch.profiler op tables")
    add_machine_args(p)
    args = p.parse_args(argv)
    args.clock = apply_machine_args(args)
    args.mode = mode_label(args, ["shapes", "warmup", "rounds"])
    args.shapes = args.shapes or (["A"] if args.quick else ["A", "B"])
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    args.rounds = args.rounds if args.rounds is not None else (4 if args.quick else 12)
    write_result("peer_hf_glm", run(args))


if __name__ == "__main__":
    main()
