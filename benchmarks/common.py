"""Shared helpers of the benchmarks: interleaved timing, medians, markdown output.

Speed is only ever reported as a ratio of variants measured side by side in one process, one
step of each in turn (interleaved), so that a noisy, shared machine slows every variant alike;
never as an absolute time asserted against a threshold.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from profiler.instruments.machine import cpu_flags, cpu_model

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------------------------
# The machine and the header every result file starts with


def machine_line() -> str:
    versions = f"torch {torch.__version__}"
    try:
        import transformers

        versions += f", transformers {transformers.__version__}"
    except ImportError:
        pass
    isa = " ".join(cpu_flags()) or "unknown"
    return (f"{cpu_model()} ({os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}, "
            f"ISA: {isa}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}); "
            f"{versions}; Python {platform.python_version()}")


def header(title: str) -> str:
    """Title, the exact command line, date and machine: the top of every result file."""
    cmd = " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.orig_argv[1:]])
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load = ""
    if hasattr(os, "getloadavg"):
        load = " (load average at start: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + ")"
    return (f"## {title}\n\n- command: `{cmd}`\n- date: {now}{load}\n- machine: {machine_line()}\n")


def add_machine_args(parser: Any) -> None:
    """--threads and --cpu-time, shared by the scripts that time functions themselves."""
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with process CPU seconds instead of wall time (use with --threads 1 on a "
                             "busy machine; not the figure to publish)")


def apply_machine_args(args: Any) -> Callable[[], float]:
    """Set torch's threads; return the clock to time with."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return time.process_time if args.cpu_time else time.perf_counter


def mode_label(args: Any, settings: Sequence[str]) -> str:
    """QUICK, full, or custom, for the result header; call before the defaults fill `settings` in.
    Only the full mode with torch's threads and wall time gives the figures to publish."""
    changed = [f"--{k.replace('_', '-')}" for k in settings if getattr(args, k, None) is not None]
    if getattr(args, "threads", None):
        changed.append(f"--threads {args.threads}")
    if getattr(args, "cpu_time", False):
        changed.append("--cpu-time")
    if args.quick:
        label = "QUICK (few steps, noisy: it checks that the script runs; do not quote its figures)"
    else:
        label = "full"
    if changed:
        label += f"; custom settings ({', '.join(changed)}): not the published configuration"
    return label


def write_result(script: str, text: str) -> Path:
    """Print `text` and write it to benchmarks/results/<script>.md."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{script}.md"
    path.write_text(text)
    print(text)
    print(f"(written to {path})")
    return path


# --------------------------------------------------------------------------------------------
# Statistics and tables


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def quartiles(xs: Sequence[float]) -> tuple[float, float]:
    """(25th, 75th) percentile; both the single value when there is one."""
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (float("nan"), float("nan"))
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> tuple[float, float, float]:
    """Median and quartiles of num[i] / den[i]: the per-round ratio of two interleaved variants,
    which cancels slow drifts of the machine that a ratio of two medians would keep."""
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    lo, hi = quartiles(ratios)
    return median(ratios), lo, hi


def fmt(x: float | None, spec: str = ".2f", na: str = "n/a") -> str:
    if x is None or x != x:  # None or NaN
        return na
    return format(x, spec)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; cells are str()-ed and pipes escaped."""
    def cell(x: object) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Timing


def interleaved(fns: dict[str, Callable[[], object]], *, warmup: int, rounds: int, progress: bool = True,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Run each fn once per round, in a rotating order, and return its steady-round times (s).

    `clock` is wall time by default; `time.process_time` (this process's CPU seconds, all threads)
    is steadier on a machine shared with other jobs when torch runs 1 thread, but it is not what a
    user waits for (and with several threads it counts their spin-waiting too).

    The first `warmup` rounds are run and discarded (allocator growth, lazy init, oneDNN kernel
    selection). Rotating the order keeps any variant from always following the same neighbour
    (cache state, thermal or scheduler effects of the one before).
    """
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = clock()
            fns[name]()
            dt = clock() - t0
            if r >= warmup:
                times[name].append(dt)
        if progress:
            tag = "warmup" if r < warmup else "round"
            last = ", ".join(f"{n} {(times[n][-1] if times[n] else dt) * 1e3:.0f} ms" for n in names)
            print(f"  {tag} {r + 1}/{warmup + rounds}: {last}", file=sys.stderr, flush=True)
    return times
