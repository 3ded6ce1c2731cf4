"""What profiling your own loop costs: the same loop bare and inside `api.run`, side by side.

    python -m benchmarks.own_loop_overhead [--quick]

The loop is a plain PyTorch loop (data, h2d, forward, backward, optimizer) training the `small`
reference model (hidden 256, 4 layers, seq 256, batch 8: the CPU demo preset) from one model and
optimizer, in one process. Each round runs it bare for N steps, then inside `api.run` with a step
and five phases per iteration, the order alternating between rounds; a variant's figure is the median
loop-iteration time of its steps, and the overhead is the median over rounds of the per-round ratio
(quartiles beside it), which cancels this shared machine's slow drifts.

Variants: `bare`; `api, trace off` (step timer, 5 Hz CPU sampler, store); `api, default` (the same
plus the torch.profiler window of the default profile: wait 2, warmup 1, active 3). For `api,
default` the steps outside the window are compared (the summaries leave the window's out too) and
the window's own steps get their own row. Accounted (precise, not a ratio of noisy times): the time
the training thread spends inside glmperf's calls, per step, and the CPU time of glmperf's threads
(sampler, store flusher) as a share of the loop's wall time. Once per run: start (creating the run,
starting the instruments) and end (closing them, finalize, diagnosis, report.html).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import fmt, header, median, mode_label, paired_ratio, table, write_result
from benchmarks.overhead import ThreadCpu
from profiler import api
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM

SEQ_LEN, BATCH = 256, 8
"""configs/small.yaml's shape."""


class Loop:
    """One model, optimizer and batch source for every variant, so they differ only in glmperf."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = GLMForCausalLM(model_config("small"))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.batches = [torch.randint(0, self.model.config.vocab_size, (BATCH, SEQ_LEN)) for _ in range(4)]

    def iteration(self, i: int, phase: Callable[[str], object]) -> torch.Tensor:
        with phase("data"):
            ids = self.batches[i % len(self.batches)]
        with phase("h2d"):
            ids = ids.to("cpu")
        with phase("forward"):
            loss = self.model(ids, labels=ids).loss
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def bare(self, steps: int) -> list[float]:
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            self.iteration(i, lambda name: _NULL)  # the same `with` statements, doing nothing
            times.append(time.perf_counter() - t0)
        return times

    def profiled(self, steps: int, runs_dir: Path, *, trace: bool) -> dict[str, object]:
        """Iteration times inside api.run, what the training thread spent in glmperf, and the run's costs."""
        spent = [0.0]

        def timed(fn: Callable[..., object]) -> Callable[..., object]:
            def call(*args: object, **kwargs: object) -> object:
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - t0
            return call

        t0 = time.perf_counter()
        run = api.run(name="overhead", runs_dir=runs_dir, model=self.model, profile={"trace": trace}).start()
        start_s = time.perf_counter() - t0
        for method in ("begin_step", "end_step", "begin_phase", "end_phase"):  # what run.step/phase call
            setattr(run, method, timed(getattr(run, method)))
        threads = ThreadCpu()
        times, cpu0 = [], threads._now()
        wall0 = time.perf_counter()
        per_step = []
        for i in range(steps):
            t0, before = time.perf_counter(), spent[0]
            with run.step(tokens=BATCH * SEQ_LEN) as step:
                step.loss = self.iteration(i, run.phase)
            times.append(time.perf_counter() - t0)
            per_step.append(spent[0] - before)
        wall = time.perf_counter() - wall0
        background = threads._now() - cpu0
        t0 = time.perf_counter()
        run.end()
        end_s = time.perf_counter() - t0
        window = _window(run)
        return {"times": times, "hooks_s": per_step, "background": background / wall,
                "start_s": start_s, "end_s": end_s, "window": window}


class _Null:
    def __enter__(self) -> None: ...
    def __exit__(self, *exc: object) -> None: ...


_NULL = _Null()


def _window(run: api.Run) -> set[int]:
    from profiler import store

    steps = store.read_table(run.dir, "steps")
    return set(steps.loc[steps["profiled"], "step"].astype(int))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 rounds of 8 steps (noisy; for checking)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--steps", type=int)
    args = parser.parse_args()
    label = mode_label(args, ["rounds", "steps"])
    rounds = args.rounds or (2 if args.quick else 6)
    steps = args.steps or (8 if args.quick else 16)
    skip = 2  # each variant's first iterations: allocator growth after the other variant ran
    loop = Loop()
    loop.bare(3)  # warm-up: oneDNN kernel choice, first allocations
    times: dict[str, list[float]] = {"bare": [], "api, trace off": [], "api, default": [], "window": []}
    acc: dict[str, list[dict]] = {"api, trace off": [], "api, default": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = ["bare", "api, trace off", "api, default"]
            order = order[r % 3:] + order[:r % 3]
            for name in order:
                if name == "bare":
                    times["bare"].append(median(loop.bare(steps)[skip:]))
                    continue
                out = loop.profiled(steps, Path(tmp), trace=name == "api, default")
                acc[name].append(out)
                outside = [i for i in range(skip, steps) if i not in out["window"]]
                times[name].append(median([out["times"][i] for i in outside]))
                out["hooks_s"] = median([out["hooks_s"][i] for i in outside])
                if out["window"]:
                    times["window"].append(median([out["times"][i] for i in sorted(out["window"])]))
            print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {times[n][-1] * 1e3:.1f} ms" for n in times
                                                          if times[n]), file=sys.stderr, flush=True)
    rows = []
    for name in ("api, trace off", "api, default", "window"):
        if not times[name]:
            continue
        ratio, lo, hi = paired_ratio(times[name], times["bare"])
        what = "the window's steps (profiled)" if name == "window" else f"{name}, steps outside the window"
        rows.append([what, fmt(median(times["bare"]) * 1e3, ".1f"), fmt(median(times[name]) * 1e3, ".1f"),
                     f"{(ratio - 1) * 100:+.2f}% [{(lo - 1) * 100:+.2f}, {(hi - 1) * 100:+.2f}]"])
    accounted = []
    for name, outs in acc.items():
        step_ms = median(times["bare"]) * 1e3
        hooks_us = median([o["hooks_s"] for o in outs]) * 1e6
        background = median([o["background"] for o in outs]) * 100
        calls = hooks_us / 1e3 / step_ms * 100
        once = [fmt(median([o[k] for o in outs]), ".2f") for k in ("start_s", "end_s")]
        accounted.append([name, fmt(hooks_us, ".0f"), fmt(calls, ".3f"), fmt(background, ".2f"),
                          fmt(calls + background, ".2f"), *once])
    out = [header("Profiling the user's own loop" + (" (quick, noisy)" if args.quick else "")),
           f"- mode: {label}\n",
           f"- loop: plain PyTorch, the `small` reference model (seq {SEQ_LEN}, batch {BATCH}), AdamW; {rounds} "
           f"rounds of {steps} steps per variant, the first {skip} of each left out\n\n",
           "Side by side (median of the per-round ratio of median iteration times, [quartiles]):\n\n",
           table(["steps", "bare (ms/step)", "with api.run (ms/step)", "overhead vs bare"], rows),
           "\nAccounted (medians over the rounds; steps outside the window): glmperf's calls on the training "
           "thread per step, its threads' "
           "CPU time over the loop's wall time, and what a run costs once at its start and end:\n\n",
           table(["variant", "calls per step (us)", "calls (% of bare step)", "background threads (% of wall)",
                  "overhead (% of wall)", "start (s)", "end: finalize + report (s)"], accounted)]
    write_result("own_loop_overhead", "".join(out))


if __name__ == "__main__":
    main()
