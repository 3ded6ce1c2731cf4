"""`glmperf plan`: per-rank memory and communication of a config's layout, before running it.

    glmperf plan --preset glm4-9b --nproc 8 --set switches.parallel.fsdp=8 --gpu h200 [--json]

Computed on this machine without the devices it plans for (profiler.advice.plan); exit code 0 when the
plan fits (or no capacity was given), 1 when it does not, 2 for a config or layout that cannot run.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from optimizers.config import check_number
from profiler.advice.gpus import GPUS_GB
from profiler.cli import common

if TYPE_CHECKING:
    from profiler.advice.plan import Plan


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="per-rank memory and communication of a config's layout, without running it")
    common.add_preset(p, "a shipped config (configs/<name>.yaml) or a model preset")
    common.add_config(p, "a YAML config file (after the preset)")
    common.add_set(p, "override one config value, e.g. switches.parallel.fsdp=8 (repeatable)", metavar="KEY=VALUE")
    p.add_argument("--nproc", type=int, default=1, help="ranks (devices) the run would have")
    p.add_argument("--gpu", choices=sorted(GPUS_GB), help="the device whose memory the plan must fit in")
    p.add_argument("--memory-gb", type=float, help="the memory of one device in GB (1e9 bytes), instead of --gpu")
    common.add_json(p, "print the plan as JSON")


MAX_MEMORY_GB = 1_000_000
"""The most memory one device may be said to hold, in GB: thousands of times today's largest."""


def capacity(args: argparse.Namespace, budget_gb: float) -> int | None:
    """Bytes one device holds: --memory-gb, --gpu, else the config's profile.memory_budget_gb (GiB)."""
    if args.memory_gb is not None:
        check_number("--memory-gb", args.memory_gb, lo=0.0, hi=MAX_MEMORY_GB, lo_open=True)
        return int(args.memory_gb * 1e9)
    if args.gpu:
        return int(GPUS_GB[args.gpu] * 1e9)
    return int(budget_gb * 2**30) or None


def _gb(n: int) -> str:
    return f"{n / 1e9:,.2f} GB"


def render(p: Plan) -> str:
    """The plan as a console table, its verdict, advice and assumptions."""
    lines = [f"plan: {p.preset} on {p.nproc} rank(s), layout {p.layout.describe()}, micro-batch {p.micro_batch}",
             "", "per rank            bytes        held in"]
    for part in ("params", "grads", "optimizer", "activations", "buffers"):
        lines.append(f"  {part:<12} {_gb(p.per_rank_bytes[part]):>14}   {p.precision[part]}")
    lines.append(f"  {'total':<12} {_gb(p.per_rank_bytes['total']):>14}")
    if len(p.per_stage_bytes) > 1:
        lines.append("  by pipeline stage: " + "; ".join(
            f"{s} {_gb(b['total'])} (activations {_gb(b['activations'])})" for s, b in enumerate(p.per_stage_bytes)))
    ac = p.activations_by_checkpointing
    lines.append(f"  activations by checkpointing: off {_gb(ac['off'])}, full {_gb(ac['full'])}, "
                 f"selective every 2 {_gb(ac['selective'])}")
    comm = p.comm_bytes_per_step
    lines += ["", "communication per step (payload): " + ", ".join(
        f"{kind} {_gb(comm[kind])}" for kind in ("all_gather", "reduce_scatter", "all_reduce", "send_recv", "total"))]
    if p.bubble is not None:
        lines.append(f"pipeline bubble: {p.bubble:.1%} of the step (theory: (p-1)/(v*m+p-1))")
    lines.append("")
    if p.capacity_bytes is None:
        lines.append("fits: unknown (give --gpu NAME or --memory-gb N)")
    else:
        lines.append(f"fits: {'yes' if p.fits else 'NO'}: {_gb(p.per_rank_bytes['total'])} of "
                     f"{_gb(p.capacity_bytes)} per device")
    for text in p.advice:
        lines.append(f"  to fit: {text}")
    lines += ["", "assumptions:"] + [f"  - {a}" for a in p.assumptions]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from optimizers.parallel import MAX_RANKS
    from profiler.advice.plan import plan
    from profiler.config import load_config

    check_number("--nproc", args.nproc, lo=1, hi=MAX_RANKS)
    cfg = load_config(config=args.config, preset=args.preset, overrides=args.overrides, nproc=args.nproc,
                      check_here=False)
    result = plan(cfg, args.nproc, capacity_bytes=capacity(args, cfg.profile.memory_budget_gb))
    if args.json:
        common.print_json(result.to_dict())
    else:
        print(render(result))
    return common.EXIT_FINDING if result.fits is False else common.EXIT_OK
