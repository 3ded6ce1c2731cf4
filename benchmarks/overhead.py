"""What measuring costs: default instruments vs none, the torch.profiler window, and profile-run end to end.

    python -m benchmarks.overhead [--quick]

1. Default instruments (step timer + sampler at profile.sample_hz, trace window off), two ways. Accounted: the
   time the training thread spends inside the instruments' hooks plus the CPU time of their
   threads (sampler, store flusher), over the training wall time; precise, and on 2 busy cores
   every background CPU second is a second taken from training. A/B: the same run with
   instruments off (`profile.instruments=false`), in interleaved pairs of runs; the median
   per-pair ratio of median loop-iteration times. This machine's step-to-step noise (about +-10%)
   is larger than the effect, so the A/B figure only bounds it.
2. The trace window (3 of N steps profiled) and plain torch.profiler on every step (the window
   covering all steps), against instruments off; the window's export and operator aggregation
   happen after training and are reported as their own figure (`trace_processing_s`).
3. `profile-run --preset tiny --steps 50` as a user runs it: wall time, split into start-up
   (imports, config, model build, until the first step starts), training, finalize, and the
   end-probe of its advice (run.json `end_probes.seconds`; `--probe-budget`, 10 s by default).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from prometheus_client import CollectorRegistry, generate_latest

from benchmarks.common import fmt, header, median, paired_ratio, table, write_result
from profiler import store
from profiler.capture.run import profile_run
from profiler.config import load_config
from profiler.instruments.prometheus import Figures
from profiler.instruments.samplers import CpuBackend, Sampler
from profiler.instruments.step_timer import StepTimer
from profiler.settings import ProfileConfig
from reference_model.hooks import TrainerHook, TrainStart
from reference_model.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
HZ = ProfileConfig().sample_hz
"""The default sampling rate: what a user's run pays."""


class IterationClock(TrainerHook):
    """Loop-iteration times: from one step's start to the next's, every hook's work included."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_step_start(self, step: int) -> None:
        self.starts.append(time.perf_counter())

    def steady(self, skip: int) -> list[float]:
        return [b - a for a, b in zip(self.starts[skip:], self.starts[skip + 1:], strict=False)]


class Timed(TrainerHook):
    """Forwards every in-step hook call to `inner` and adds up the time spent in it."""

    def __init__(self, inner: TrainerHook) -> None:
        self.inner, self.spent = inner, 0.0

    def _timed(self, name: str, *args: object) -> None:
        t0 = time.perf_counter()
        getattr(self.inner, name)(*args)
        self.spent += time.perf_counter() - t0

    def on_train_start(self, start: TrainStart) -> None:
        self.inner.on_train_start(start)

    def on_train_end(self, result, error) -> None:
        self.inner.on_train_end(result, error)

    def on_step_start(self, step: int) -> None:
        self._timed("on_step_start", step)

    def on_phase_start(self, step: int, phase: str) -> None:
        self._timed("on_phase_start", step, phase)

    def on_phase_end(self, step: int, phase: str) -> None:
        self._timed("on_phase_end", step, phase)

    def on_step_end(self, record) -> None:
        self._timed("on_step_end", record)


class ThreadCpu(TrainerHook):
    """CPU seconds of our background threads (sampler, store), read at every step end."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.last = 0.0

    def _now(self) -> float:
        ids = {t.native_id for t in threading.enumerate() if t.name.startswith("glmperf-")}
        return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)

    def on_step_start(self, step: int) -> None:
        if self.start is None:
            self.start = self._now()

    def on_step_end(self, record) -> None:
        self.last = self._now()


def accounted(preset: str, steps: int, runs_dir: Path) -> list[object]:
    cfg = load_config(preset=preset, overrides=[f"train.steps={steps}", "data.corpus=synthetic"])
    runs_dir.mkdir(parents=True, exist_ok=True)
    writer = store.RunWriter(store.create_run(runs_dir, "accounted", {}), flush_interval_s=2.0)
    timer = Timed(StepTimer(writer))
    sampler = Timed(Sampler(writer, CpuBackend(), hz=HZ, current_step=lambda: timer.inner.current_step))
    clock, threads = IterationClock(), ThreadCpu()
    Trainer(model_cfg=cfg.model, data_cfg=cfg.data, train_cfg=cfg.train, switches=cfg.switches,
            hooks=[clock, threads, timer, sampler]).fit()
    writer.close()
    wall = clock.starts[-1] - clock.starts[0]  # step 0's start to the last step's start
    hooks = (timer.spent + sampler.spent) * (len(clock.starts) - 1) / len(clock.starts)
    background = threads.last - (threads.start or 0.0)
    return [preset, steps, fmt(wall / (len(clock.starts) - 1) * 1e3, ".1f"),
            fmt(hooks / (len(clock.starts) - 1) * 1e6, ".0f"), fmt(background / wall * 100, ".2f"),
            fmt((hooks + background) / wall * 100, ".2f")]


SCRAPER = """
import sys, time, urllib.request
while True:
    try:
        urllib.request.urlopen(sys.argv[1], timeout=1).read()
    except OSError:
        pass
    time.sleep(float(sys.argv[2]))
"""
"""Prometheus' part, in its own process: fetch the job's metrics every interval."""
SCRAPE_S = 1.0
"""Scrape interval: 1 s, far more often than a cluster scrapes (Prometheus: 1 min by default, 15 s is common), so
that a serving cost would show."""


def serving_cost(run_dir: Path, scrapes: int = 200) -> list[object]:
    """What live metrics cost, accounted: the tap's work per step on the training thread (keeping the
    last row and counting), and one scrape's rendering in the server's thread, fed the real rows of
    `run_dir` (a completed run, its steps and samples replayed in order)."""
    steps = store.read_table(run_dir, "steps").to_dict("records")
    samples = store.read_table(run_dir, "samples").to_dict("records")
    figures = Figures({"run_id": "r", "run_name": "n", "rank": "0", "host": "h"},
                      {"source": "profile-run", "device": "cpu", "world_size": "1"})
    t0 = time.perf_counter()
    for row in steps:
        figures.add_steps([row])
    per_step = (time.perf_counter() - t0) / len(steps)
    figures.add_samples(samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(figures)
    t0 = time.process_time()
    for _ in range(scrapes):
        body = generate_latest(registry)
    per_scrape = (time.process_time() - t0) / scrapes
    step_s = median([r["step_s"] for r in steps])
    return [len(steps), fmt(step_s * 1e3, ".1f"), fmt(per_step * 1e6, ".1f"), fmt(per_step / step_s * 100, ".3f"),
            fmt(per_scrape * 1e3, ".2f"), len(body), fmt(per_scrape / SCRAPE_S * 100, ".3f")]


def one_run(runs_dir: Path, preset: str, steps: int, overrides: list[str]) -> tuple[float, dict]:
    cfg = load_config(preset=preset, overrides=[f"train.steps={steps}", "data.corpus=synthetic",
                                                "switches.stability.nan_guard=off", *overrides])
    clock = IterationClock()
    scraper = None
    if cfg.profile.metrics_port:
        url = f"http://127.0.0.1:{cfg.profile.metrics_port}/metrics"
        scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, url, str(SCRAPE_S)])
    try:
        run_dir = profile_run(cfg, runs_dir=runs_dir, progress=False, hooks=[clock])
    finally:
        if scraper is not None:
            scraper.kill()
            scraper.wait()
    record = store.read_run(run_dir)
    assert record["status"] == "completed", record.get("error")
    return median(clock.steady(skip=3)), record


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


VARIANTS = {
    "off": ["profile.instruments=false"],
    "default": ["profile.trace=false"],
    "metrics": ["profile.trace=false", f"profile.metrics_port={_free_port()}", "profile.metrics_host=127.0.0.1"],
    "window": ["profile.trace=true", "profile.trace_window=[3, 1, 3]"],
}


def overhead(preset: str, steps: int, pairs: int, runs_dir: Path) -> list[list[object]]:
    every = ["profile.trace=true", f"profile.trace_window=[0, 0, {steps}]"]
    variants = {**VARIANTS, "every step": every}
    times: dict[str, list[float]] = {v: [] for v in variants}
    processing: dict[str, list[float]] = {v: [] for v in variants}
    for pair in range(pairs):
        order = list(variants)[pair % len(variants):] + list(variants)[:pair % len(variants)]
        for name in order:
            t, record = one_run(runs_dir, preset, steps, variants[name])
            times[name].append(t)
            window = record["ranks"][0].get("instruments", {}).get("TraceWindow", {})
            if "trace_processing_s" in window:
                processing[name].append(window["trace_processing_s"])
        print(f"  {preset} pair {pair + 1}/{pairs}: " + ", ".join(f"{n} {times[n][-1] * 1e3:.1f} ms"
                                                             for n in variants), file=sys.stderr)
    rows = []
    for name, base in (("default", "off"), ("metrics", "default"), ("window", "off"), ("every step", "off")):
        ratio, lo, hi = paired_ratio(times[name], times[base])
        rows.append([preset, name, base, fmt(median(times[base]) * 1e3, ".1f"), fmt(median(times[name]) * 1e3, ".1f"),
                     f"{(ratio - 1) * 100:+.2f}% [{(lo - 1) * 100:+.2f}, {(hi - 1) * 100:+.2f}]",
                     fmt(median(processing[name]), ".2f") if processing[name] else "-"])
    return rows


def end_to_end(runs_dir: Path, steps: int) -> list[list[object]]:
    t0 = time.time()
    proc = subprocess.run([str(Path(sys.executable).parent / "profile-run"), "--preset", "tiny", "--steps",
                           str(steps), "--runs-dir", str(runs_dir), "--no-progress"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    wall = time.time() - t0
    run_dir = Path(next(line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("run:")))
    steps_df = store.read_table(run_dir, "steps")
    first_start = float(steps_df["ts_end"].iloc[0] - steps_df["host_s"].iloc[0])
    last_end = float(steps_df["ts_end"].iloc[-1])
    probing = float((store.read_run(run_dir).get("end_probes") or {}).get("seconds", 0.0))
    return [[f"profile-run --preset tiny --steps {steps}", fmt(wall, ".1f"), fmt(first_start - t0, ".1f"),
             fmt(last_end - first_start, ".1f"), fmt(t0 + wall - last_end - probing, ".1f"), fmt(probing, ".1f")]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 pairs of short runs (noisy; for checking)")
    args = parser.parse_args()
    pairs, steps = (2, 12) if args.quick else (5, 30)
    out = [header("Measurement overhead" + (" (quick, noisy)" if args.quick else ""))]
    with tempfile.TemporaryDirectory() as tmp:
        acc = [accounted(p, steps * 10 if p == "tiny" else steps * 2, Path(tmp) / "acc") for p in ("tiny", "small")]
        out.append(f"\nAccounted cost of the default instruments (step timer + {HZ:g} Hz CPU sampler + store):\n\n")
        out.append(table(["preset", "steps", "ms/step", "hook time per step (us)", "background threads (% of wall)",
                          "overhead (% of wall)"], acc))
        served = []
        for preset in ("tiny", "small"):
            _, record = one_run(Path(tmp) / "served", preset, steps * 4, ["profile.trace=false"])
            served.append([preset, *serving_cost(Path(tmp) / "served" / record["id"])])
        out.append("\nAccounted cost of serving live metrics (profile.metrics_port), on the real rows of a run: the "
                   "tap on the training thread per step, and one scrape's rendering (CPU time of the server's thread), "
                   f"as a share of wall time at one scrape every {SCRAPE_S:g} s:\n\n")
        out.append(table(["preset", "steps", "ms/step", "tap per step (us)", "tap (% of step)", "scrape (ms CPU)",
                          "scrape (bytes)", f"scrapes at {SCRAPE_S:g} s (% of wall)"], served))
        rows = []
        for preset in ("tiny", "small"):
            rows += overhead(preset, steps if preset == "tiny" else steps // 2, pairs, Path(tmp) / preset)
        out.append(f"\n{pairs} interleaved rounds of {steps} steps (small: {steps // 2}); figure = median of the "
                   "per-round ratio of median loop-iteration times, [quartiles]. `off`: "
                   f"profile.instruments=false. `default`: step timer + {HZ:g} Hz sampler, no trace. `metrics`: "
                   f"default + live Prometheus metrics served (profile.metrics_port), scraped every {SCRAPE_S:g} s "
                   "by another process; against `default`. `window`: + "
                   "torch.profiler on 3 steps (wait 3, warmup 1). `every step`: torch.profiler active on every "
                   "step. Trace processing (export + operator table, after training) is its own column.\n\n")
        out.append(table(["preset", "instruments", "against", "against (ms/step)", "on (ms/step)", "overhead",
                          "trace processing (s)"], rows))
        columns = ["command", "wall (s)", "start-up (s)", "training (s)", "finalize (s)", "end-probe (s)"]
        out.append("\n" + table(columns, end_to_end(Path(tmp) / "e2e", 50)))
    write_result("overhead", "".join(out))


if __name__ == "__main__":
    main()
