"""What-if probes at the end of a profile-run run, in the run's own process: the changes `glmperf
recommend` would probe for the run, measured by the same code (profiler.advice.advise with a probe
budget) into the same cache ($GLMPERF_CACHE/probes), so that recommend then reads them instead of
measuring. Here the process is warm: a fresh `recommend` pays torch's imports first (the compiler stack
that the first optimizer step imports took 1.25 s of a 3.4 s probe of `small` on a 2-core EPYC).

Only a completed single-process run with counted steps is probed, within `profile.probe_budget_s`
(profile-run --probe-budget), spent as recommend spends its own, except that compile is left to
recommend: its probe costs its compile time, which no budget can stop. The advice with its measured
ranges replaces run.json `diagnosis` (as `glmperf recommend` stores it), so the summary profile-run then
prints, the report and the dashboard show what was measured; what probing cost goes into run.json
`end_probes`; a failure into `end_probes_error`, never costing the run its record. Ctrl-C (or
SIGTERM) stops the probing and leaves run.json as it was: the run completed, and every probe finished
before it is cached.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiler import store
from profiler.advice.advise import advise
from profiler.advice.measured import ProbeBudget
from profiler.analysis import load_run
from profiler.capture.ranks import sigterm_as_interrupt
from profiler.settings import settings_text


@dataclass(frozen=True)
class EndProbes:
    """What probing at a run's end did, as the one line profile-run prints."""

    line: str
    interrupted: bool = False


def probe_at_end(run_dir: Path, *, budget_s: float,
                 progress: Callable[[str], None] | None = None) -> EndProbes | None:
    """Probe the run's advice within about `budget_s` seconds and record what it cost (run.json
    `end_probes`); None where nothing is to be probed: a budget of 0, a run that did not complete, ran
    several ranks or counted no step."""
    record = store.read_run(run_dir)
    if budget_s <= 0 or record.get("status") != "completed" or record.get("world_size", 1) != 1 \
            or not (record.get("summary") or {}).get("steps_counted"):
        return None
    started = time.perf_counter()
    try:
        with sigterm_as_interrupt():
            advice = advise(load_run(run_dir), probes=ProbeBudget(total_s=budget_s, dearest=False),
                            progress=progress)
            probes = advice.get("probes", {})  # none where nothing is advised
            entry = {"budget_s": budget_s, "seconds": round(time.perf_counter() - started, 1),
                     "measured": probes.get("measured", 0), "cached": probes.get("cached", 0),
                     "changes": probes.get("changes", [])}
            store.update_run(run_dir, end_probes=entry, diagnosis=advice)  # one write: Ctrl-C leaves neither
    except KeyboardInterrupt:
        return EndProbes(f"probing stopped: run {run_dir.name} is completed as it was (each probe that finished is "
                         "cached)", interrupted=True)
    except Exception as exc:  # advice is a reading of the run: it never costs the run its record
        error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError, store.StoreError):
            store.update_run(run_dir, end_probes_error=error)
        return EndProbes(f"probing failed ({error}): the run is kept as it was; `glmperf recommend "
                         f"{run_dir.name}` probes again")
    return EndProbes(end_probes_line(entry, run_dir.name))


def end_probes_line(entry: Mapping[str, Any], run_id: str) -> str:
    """What probing at the run's end did, in one line: what it measured, in how long, and what is left."""
    changes = entry.get("changes", [])
    by_state = {s: [c for c in changes if c["state"] == s] for s in ("measured", "cached", "left", "failed")}
    parts = [f"{len(by_state['cached'])} measured before"] if by_state["cached"] else []
    if by_state["left"]:
        parts.append("left to recommend: " + ", ".join(settings_text(c["set"]) for c in by_state["left"]))
    parts += [f"{settings_text(c['set'])}: {c['why']}" for c in by_state["failed"][:1]]
    n = len(by_state["measured"])
    head = f"probed {n} change{'' if n == 1 else 's'} in {entry['seconds']:.1f} s"
    if not changes:
        return f"{head}: no change advised for run {run_id} is one a probe measures in one process"
    done = n + len(by_state["cached"])
    detail = f" ({'; '.join(parts)})" if parts else ""
    uses = f"uses {'it' if done == 1 else 'them'}" if done else "probes again"
    return f"{head}{detail}: `glmperf recommend {run_id}` {uses}"
