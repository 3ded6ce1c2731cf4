"""How long glmperf's read commands take from a cold start, how much memory, and whether torch loads.

    PYTHONPATH=$PWD python -m benchmarks.cold_start [--quick] [--rounds N] [--baseline DIR]

Run it from the repository root with the project's virtualenv. Each command runs as a new
process, `python -c` calling `profiler.cli.main`, with this checkout's root put first on its
PYTHONPATH: the children run this checkout's code, not an installed copy.

Two `tiny` runs (20 steps) are made first, not timed, in a temporary runs directory. Then, in
each round, every command below runs once, in a rotating order (interleaved, as the other
benchmarks do), so that a busy machine slows all of them alike:

- the floor, `python -c pass`: the interpreter's own start;
- `glmperf runs`, `show RUN`, `compare A B`, `report RUN -o FILE`, `diagnose RUN`.

Per command: median and quartiles of the wall time, the same less the floor's median, the
median peak RSS of its process (VmHWM), and whether torch was imported (the
wrapper looks at `sys.modules` when the process exits).

`--baseline DIR` runs the same glmperf commands with another checkout's code too (e.g. a
`git worktree` of an older commit), in the same rounds, on the same stored runs: the before and
after of a change, side by side.

Target: under 1 s for runs, show, compare and report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, fmt, header, interleaved, median, quartiles, table, write_result
from profiler.capture.run import profile_run
from profiler.config import load_config

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 1.0
TARGETED = ("runs", "show", "compare", "report")

WRAPPER = ("import atexit, os, sys\n"
           "def _report():\n"
           "    peak = next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
           "    open(os.environ['COLD_START_OUT'], 'w').write(str(int('torch' in sys.modules)) + ' ' + peak)\n"
           "atexit.register(_report)\n"
           "{body}\n")
"""The child's program: `body`, then, at exit, whether torch was imported (1 or 0) and the process's
peak RSS (VmHWM, KiB) into $COLD_START_OUT. The peak is read there, not from the rusage of the
child, because Linux carries a forked child's peak over from its parent (this big process) across
exec. atexit, os and sys are loaded at every interpreter start: the wrapper costs the floor nothing."""

GLMPERF = "from profiler.cli import main\nsys.exit(main())"


def _commands(runs_dir: Path, a: Path, b: Path, out: Path, baseline: Path | None
              ) -> dict[str, tuple[str, list[str], Path]]:
    """name -> (the program's body, glmperf's arguments, the checkout whose code runs it)."""
    glmperf = {"runs": ["runs", "--runs-dir", str(runs_dir)],
               "show": ["show", str(a)],
               "compare": ["compare", str(a), "--vs", str(b)],
               "report": ["report", str(a), "-o", str(out)],
               "diagnose": ["diagnose", str(a)]}
    commands = {"python -c pass": ("pass", [], ROOT), **{name: (GLMPERF, argv, ROOT) for name, argv in glmperf.items()}}
    if baseline is not None:
        commands |= {f"{name} (baseline)": (GLMPERF, argv, baseline) for name, argv in glmperf.items()}
    return commands


def _spawn(body: str, argv: list[str], code_root: Path, scratch: Path) -> tuple[int, int, bool]:
    """Run one fresh process to its end: (exit code, peak RSS in bytes, torch imported)."""
    report, log = scratch / "report", scratch / "output"
    env = {**os.environ, "COLD_START_OUT": str(report),
           "PYTHONPATH": os.pathsep.join([str(code_root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with log.open("w") as out:
        # cwd too: `python -c` puts the working directory first on sys.path
        code = subprocess.run([sys.executable, "-c", WRAPPER.format(body=body), *argv], env=env, cwd=code_root,
                              stdout=out, stderr=subprocess.STDOUT).returncode
    if code not in (0, 1):  # 1 is a finding (a regression, a failed run); anything else is broken
        raise RuntimeError(f"{' '.join(argv) or body} exited {code}:\n{log.read_text()[-2000:]}")
    torch_loaded, peak_kib = report.read_text().split()
    return code, int(peak_kib) * 1024, torch_loaded == "1"


def _measure(commands: dict[str, tuple[str, list[str], Path]], scratch: Path, *, warmup: int,
             rounds: int) -> dict[str, dict[str, list[Any]]]:
    """Every command once per round, interleaved; per command its times, exit codes, RSS and torch flags."""
    samples: dict[str, dict[str, list[Any]]] = {name: {"code": [], "rss": [], "torch": []} for name in commands}

    def call(name: str) -> None:
        code, rss, torch_loaded = _spawn(*commands[name], scratch)
        for key, value in (("code", code), ("rss", rss), ("torch", torch_loaded)):
            samples[name][key].append(value)

    times = interleaved({name: partial(call, name) for name in commands}, warmup=warmup, rounds=rounds)
    for name in commands:
        samples[name] = {key: values[warmup:] for key, values in samples[name].items()}
        samples[name]["seconds"] = times[name]
    return samples


def _row(name: str, s: dict[str, list[Any]], floor: float) -> list[str]:
    mid = median(s["seconds"])
    lo, hi = quartiles(s["seconds"])
    codes = sorted(set(s["code"]))
    torch_loaded = "yes" if all(s["torch"]) else "no" if not any(s["torch"]) else "sometimes"
    ok = ("yes" if mid < TARGET_S else "NO") if name in TARGETED else "-"
    return [name, fmt(mid), f"{fmt(lo)}-{fmt(hi)}", fmt(mid - floor), fmt(median(s["rss"]) / 1e6, ".0f"),
            torch_loaded, ",".join(map(str, codes)), ok]


def _revision(checkout: Path) -> str:
    """The commit a checkout is at, for the record."""
    rev = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return rev.stdout.strip()[:80] or str(checkout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, no warmup: checks the script runs")
    parser.add_argument("--rounds", type=int, help="measured rounds (default 10)")
    parser.add_argument("--baseline", type=Path, help="another checkout whose code runs the same commands too")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)
    warmup = 0 if args.quick else 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = load_config(preset="tiny")
        a, b = (profile_run(cfg, runs_dir=root / "runs", progress=False) for _ in range(2))
        scratch = root / "scratch"
        scratch.mkdir()
        samples = _measure(_commands(root / "runs", a, b, root / "report.html", args.baseline), scratch, warmup=warmup,
                           rounds=rounds)
    floor = median(samples["python -c pass"]["seconds"])
    rows = [_row(name, s, floor) for name, s in samples.items()]
    mode = "QUICK (3 rounds: do not quote its figures)" if args.quick else "full"
    if args.rounds:
        mode += f"; custom settings (--rounds {args.rounds})"
    if args.baseline:
        mode += f"; baseline: {_revision(args.baseline)}"
    text = (header("Cold start of the read commands") + f"- mode: {mode}\n\n"
            + table(["command", "median (s)", "quartiles (s)", "less the floor (s)", "peak RSS (MB)",
                     "torch imported", "exit code", f"under {TARGET_S:g} s"], rows)
            + f"\nEach command a new process, {rounds} rounds interleaved after {warmup} warmup round(s), on two "
              "stored `tiny` runs (20 steps). The floor is `python -c pass`. Peak RSS: the process's VmHWM."
              f" Target: under {TARGET_S:g} s for {', '.join(TARGETED)}.\n")
    write_result("cold_start", text)
    (RESULTS_DIR / "cold_start.json").write_text(json.dumps(
        {"rounds": rounds, "warmup": warmup, "target_s": TARGET_S, "commands": samples}, indent=2) + "\n")


if __name__ == "__main__":
    main()
