"""A run's advice, the one entry point: its diagnosis, the changes that address it, and, when asked
for, each change's expected gain measured by a probe on this machine instead of modelled. A run of
one's own training gets its changes in its framework's terms (profiler.advice.framework), modelled.

    advise(run)                                   # modelled ranges: instant (profile-run's own end)
    advise(run, probes=ProbeBudget(total_s=120))  # measured where a probe can (glmperf recommend)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from profiler import store
from profiler.advice.diagnose import diagnose
from profiler.advice.framework import own_advice, own_training
from profiler.advice.measured import ProbeBudget, probe_advice
from profiler.advice.recommend import explore, recommend
from profiler.analysis import RunData, analyze, stored


def advise(run: RunData, *, allow_model_changes: bool = False, top: int | None = None,
           explore_when_clear: bool = False, probes: ProbeBudget | None = None,
           progress: Callable[[str], None] | None = None, to_verify: bool = False) -> dict[str, Any]:
    """The run's diagnosis and recommendations, with the figures they rest on (run.json `diagnosis`).

    `explore_when_clear`: a run with no bottleneck gets `explore`'s changes instead of none (`explored`
    says so). `probes`: measure each change's gain on this machine within that budget (a run with no
    bottleneck is then explored too: what a probe proves faster is advice even where no rule fired).
    `to_verify`: each change will be verified by fresh runs (`glmperf tune`), so an explored change a probe
    measured faster is kept on its point estimate, not only when its whole interval clears the bar."""
    figures = analyze(run)
    diagnosis = diagnose(figures)
    own = own_training(run)  # its framework's changes, modelled: a probe builds the reference trainer
    if own:
        advice = own_advice(run, figures, diagnosis, allow_model_changes=allow_model_changes)
    elif (explore_when_clear or probes is not None) and not diagnosis["bottlenecks"]:
        advice = {**explore(run, figures, allow_model_changes=allow_model_changes, probing=probes is not None),
                  "explored": True}
    else:
        advice = recommend(run, figures, diagnosis, allow_model_changes=allow_model_changes,
                           probing=probes is not None)
    if probes is not None and advice["recommendations"] and not own:
        advice = probe_advice(run, {**diagnosis, **advice}, figures, probes, progress=progress, to_verify=to_verify)
    advice["recommendations"] = advice["recommendations"][:top] if top else advice["recommendations"]
    return {**diagnosis, **advice, "allow_model_changes": allow_model_changes, "figures": stored(figures)}


def keep_advice(run: RunData, advice: Mapping[str, Any]) -> None:
    """Store measured advice in the run's record (run.json `diagnosis`), its verification kept, so the
    report and the dashboard show the measured ranges."""
    verification = run.verification
    store.update_run(run.path, diagnosis={**advice, **({"verification": verification} if verification else {})})
