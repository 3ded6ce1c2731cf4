"""Steps of a run as the summary counts them: merged across ranks, then the steady state.

Merging. A data-parallel step ends when its slowest rank does, so a step's row is the slowest
rank's row (its phases are the step's critical path, so shares describe the same time as the
step time) with the tokens of all ranks. A step recorded by fewer ranks than the run has (a rank
died or was killed) is left out and said so: its tokens would be a part of the step's.

Steady state. Left out, and said so: the first `warmup_steps` steps, compile steps (`warmup` on
any rank) and steps inside the torch.profiler window (`profiled`), whose overhead is not the run's.

Columns of the merged frame (index `step`): the steps.parquet columns of the slowest rank
(`step_s`, every phase column, `loss` as the mean over ranks, ...), `tokens` summed over ranks,
`critical_rank`, and `peak_memory_bytes`: the step's highest CUDA allocated peak over ranks, or on
CPU the highest RSS high-water mark (RSS where the mark is not available).
"""

from __future__ import annotations

import pandas as pd


def _ranges(steps: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out: list[str] = []
    for s in sorted(steps):
        if out and int(out[-1].rsplit("-", 1)[-1]) == s - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


def _peak_memory(steps: pd.DataFrame) -> tuple[pd.Series, str]:
    """Per-row peak memory and its source, the best measure the run has."""
    for column, source in (("mem_alloc_peak_bytes", "torch.cuda.max_memory_allocated"),
                           ("rss_peak_bytes", "process RSS high-water mark (CPU)"),
                           ("rss_bytes", "process RSS at step end (CPU)")):
        if column in steps and steps[column].notna().any():
            return steps[column], source
    return pd.Series(float("nan"), index=steps.index), "not measured"


def merge_ranks(steps: pd.DataFrame, world_size: int) -> tuple[pd.DataFrame, list[str], str]:
    """One row per step (see the module docstring), the notes on what was left out, the memory source."""
    if steps.empty:
        return steps, ["no steps were recorded"], "not measured"
    notes: list[str] = []
    peak, source = _peak_memory(steps)
    steps = steps.assign(peak_memory_bytes=peak)
    ranks_per_step = steps.groupby("step")["rank"].nunique()
    partial = ranks_per_step[ranks_per_step < world_size].index.tolist()
    if partial:
        notes.append(f"step(s) {_ranges(partial)} were recorded by fewer than all {world_size} ranks "
                     "(a rank stopped early) and are left out")
        steps = steps[~steps["step"].isin(partial)]
        if steps.empty:
            return steps, notes, source
    grouped = steps.groupby("step")
    slowest = steps.loc[grouped["step_s"].idxmax()].set_index("step")
    merged = slowest.assign(
        tokens=grouped["tokens"].sum(min_count=1), loss=grouped["loss"].mean(),
        warmup=grouped["warmup"].any() if "warmup" in steps else False,
        profiled=grouped["profiled"].any() if "profiled" in steps else False,
        skipped=grouped["skipped"].any() if "skipped" in steps else False,
        peak_memory_bytes=grouped["peak_memory_bytes"].max(), critical_rank=slowest["rank"])
    return merged.sort_index(), notes, source


def steady_steps(merged: pd.DataFrame, warmup_steps: int) -> tuple[pd.DataFrame, list[str]]:
    """The merged steps that represent the run's steady state, and what was left out."""
    if merged.empty:
        return merged, []
    notes = [f"first {warmup_steps} step(s) excluded as warmup"]
    keep = merged.index >= merged.index.min() + warmup_steps
    for column, why in (("warmup", "compile"), ("profiled", "inside the torch.profiler window")):
        if column in merged and merged[column].astype(bool).any():
            keep &= ~merged[column].astype(bool).to_numpy()
            notes.append(f"steps {why} excluded")
    if not keep.any():
        notes.append("too few steps for that: all steps used")
        return merged, notes
    return merged[keep], notes
