"""Operators from the torch.profiler window (ops.parquet): how many, how heavy, and which kinds.

Times are self times of `aten::` operators per profiled step: the device's on CUDA
(`self_device_s`), the host's on CPU (`self_cpu_s`; the profiler's own overhead inflates them, so
shares are used, not absolute times). Figures:

- `op_calls_per_step`: aten operator calls per step (forward, backward, optimizer).
- `tiny_op_share` (% of operator time): time in operators whose calls average under 10 us, i.e.
  the framework's per-call work (dispatch, autograd bookkeeping, allocation) rather than
  arithmetic; HTA's kernel-launch statistics make the same cut on the GPU side (launch 5-20 us).
- `device_busy` (% of the step, CUDA): operator time on the device over the step time.
- `matmul_share`, `attention_share` (% of operator time): matrix multiplies (mm, addmm, bmm,
  scaled-dot-product attention); attention (SDPA and its backward, bmm, 4-D softmax: the model's
  other matmuls are 2-D linears).
- `attention_fused_share` (% of attention time): in fused SDPA kernels (eager attention: 0).
- `attention_flop_share` (% of the model's FLOPs per token): attention's QK^T and AV matmuls, the
  part that grows with the sequence (12*L*H*Q*T of PaLM's count; the reference trainer's runs).

A share with nothing to divide (no operator time: device time that no operator launched, as on an
MTIA trace, whose runtime calls ops.parquet does not pair; no step time) is NaN, its source saying why.

`top_operators(run, n)` is the table behind them, heaviest first.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from profiler.analysis.figures import Figure, Figures, num
from profiler.analysis.loader import RunData

MATMUL = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addmv|_scaled_dot_product|scaled_dot_product)")
ATTENTION = re.compile(r"^aten::(.*scaled_dot_product.*|.*attention.*|bmm|baddbmm)$")
TINY_OP_S = 10e-6
"""An operator call averaging less than this is overhead, not arithmetic."""
FUSED_ATTENTION = re.compile(r"^aten::_?scaled_dot_product")
"""SDPA: attention in fused kernels, the (T, T) scores never stored (eager attention is bmm + softmax)."""
SOFTMAX = re.compile(r"^aten::(_softmax|softmax|_softmax_backward_data)$")


def per_step(run: RunData) -> pd.DataFrame:
    """aten operators of one rank (the lowest), with `time_s` and `calls` per profiled step."""
    ops = run.ops
    if ops.empty or "steps" not in ops:
        return pd.DataFrame(columns=["name", "input_shapes", "calls", "time_s"])
    ops = ops[(ops["rank"] == ops["rank"].min()) & ops["name"].str.startswith("aten::") & (ops["steps"] > 0)]
    column = "self_device_s" if run.on_cuda else "self_cpu_s"
    return pd.DataFrame({"name": ops["name"], "input_shapes": ops["input_shapes"],
                         "calls": ops["calls"] / ops["steps"], "time_s": ops[column] / ops["steps"]})


def _attention(ops: pd.DataFrame) -> pd.Series:
    four_d = ops["input_shapes"].str.match(r"^\[\[\d+, \d+, \d+, \d+\]")
    return ops["name"].str.match(ATTENTION) | (ops["name"].str.match(SOFTMAX) & four_d)


_SHAPED: dict[str, tuple[str, tuple[int, ...]]] = {
    "aten::mm": ("mm", (0, 1)), "aten::bmm": ("mm", (0, 1)), "aten::addmm": ("mm", (1, 2))}
"""Matmuls whose operand shapes the ops table records, and which inputs are the operands."""
SDPA_FORWARD = re.compile(r"^aten::_scaled_dot_product_\w*attention\w*$")
"""Fused attention forwards (flash, efficient, cudnn; the CPU flash kernel): inputs q, k, v first."""


def precision_work(run: RunData, top: int = 8) -> list[tuple[str, tuple[tuple[int, ...], ...], float]]:
    """The heaviest matmul and attention calls of the profiled steps, to time in another precision:
    (kind "mm" or "sdpa", operand shapes, calls per step), at most `top` of each kind."""
    ops = per_step(run).sort_values("time_s", ascending=False)
    picked: list[tuple[str, tuple[tuple[int, ...], ...], float]] = []
    for name, text, calls in zip(ops["name"], ops["input_shapes"], ops["calls"], strict=True):
        if name in _SHAPED:
            kind, which = _SHAPED[name]
        elif SDPA_FORWARD.match(name) and not name.endswith("_backward"):
            kind, which = "sdpa", (0, 1, 2)
        else:
            continue
        if sum(1 for k, _, _ in picked if k == kind) >= top:
            continue
        try:
            inputs = ast.literal_eval(text)
            shapes = tuple(tuple(inputs[i]) for i in which)
        except (ValueError, SyntaxError, IndexError, TypeError):
            continue
        if all(shapes):
            picked.append((kind, shapes, float(calls)))
    return picked


def top_operators(run: RunData, n: int = 10) -> pd.DataFrame:
    """The `n` heaviest operators per step: name, calls, time (ms), share of operator time (%)."""
    ops = per_step(run).groupby("name", as_index=False)[["calls", "time_s"]].sum()
    total = ops["time_s"].sum()
    ops = ops.sort_values("time_s", ascending=False).head(n)
    return pd.DataFrame({"name": ops["name"], "calls": ops["calls"], "time_ms": ops["time_s"] * 1e3,
                         "share": 100 * ops["time_s"] / total if total > 0 else float("nan")})


def _percent(part: float, whole: float, source: str) -> Figure:
    """`part` as % of `whole`, or NaN saying why where `whole` is no time (0 or unknown)."""
    if whole > 0:
        return Figure(100 * part / whole, "%", source)
    return Figure(math.nan, "%", f"{source}: not computed, the time to divide by is {whole:g} s")


def analyze(run: RunData, summary: Mapping[str, Any]) -> Figures:
    ops = per_step(run)
    if ops.empty:
        return {}
    total = float(ops["time_s"].sum())
    calls = float(ops["calls"].sum())
    attention = float(ops.loc[_attention(ops), "time_s"].sum())
    step_s = num((summary.get("step_time_s") or {}).get("mean"))
    source = "ops.parquet (" + ("self_device_s" if run.on_cuda else "self_cpu_s") + ")"
    out: Figures = {
        "op_calls_per_step": Figure(calls, "calls", "ops.parquet (calls / steps)"),
        "tiny_op_share": _percent(float(ops.loc[ops["time_s"] < TINY_OP_S * ops["calls"], "time_s"].sum()), total,
                                  source),
        "matmul_share": _percent(float(ops.loc[ops["name"].str.match(MATMUL), "time_s"].sum()), total, source),
        "attention_share": _percent(attention, total, source),
    }
    if attention > 0:
        fused = float(ops.loc[ops["name"].str.match(FUSED_ATTENTION), "time_s"].sum())
        out["attention_fused_share"] = _percent(fused, attention, source + ", SDPA kernels / attention")
    flops = num(run.flops_per_token)
    attention_flops = num(run.model.get("attention_flops_per_token"))
    if flops > 0 and attention_flops >= 0:
        out["attention_flop_share"] = Figure(100 * attention_flops / flops, "%",
                                             "model.attention_flops_per_token / model.flops_per_token")
    if run.on_cuda:
        out["device_busy"] = _percent(total, step_s, "ops.parquet self_device_s / summary.step_time_s.mean")
    return out
