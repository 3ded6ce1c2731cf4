"""The collectives matched across ranks (summary.trace.collectives_across_ranks, profiler.traces.collective_skew)
as one table that the run report and the dashboard's run page both show, with the straggler it names.

Read as stored, field by field: a field a summary lacks (an older import, or one from before a field was
added, such as the process `groups`) shows as "-" or leaves its column out, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from profiler.traces.collective_skew import LAST_SHARE, MIN_CALLS, SKEW_OF_STEP, clocks_text, ranks_text

CAPTION = ("Each kind's NCCL kernels matched across the ranks (the k-th call of the kind in a step on every rank). "
           "Skew: the last rank's kernel start minus the first's, per call (on one clock: where the ranks' clocks "
           "differ, their offsets are measured by the calls' common end). Waiting: the ranks of a collective finish "
           "together, so a rank that arrives early waits inside its kernel for the last one; the share is that "
           "waiting over all the kind's kernel time, summed over ranks. Bus bandwidth: payload over the last "
           "rank's kernel time, times NCCL's factor for the kind and the ranks (nccl-tests), against the GPU "
           "link's peak each way.")
RULE = (f"a rank is named when it is last in over {100 * LAST_SHARE:.0f}% of at least {MIN_CALLS} calls of a kind "
        f"whose median skew is over {100 * SKEW_OF_STEP:.0f}% of the median step")


@dataclass(frozen=True)
class AcrossRanks:
    """The table's headers and rows (numbers as text), the columns that hold numbers, and the notes under it."""

    headers: list[str]
    rows: list[list[str]]
    numeric: tuple[int, ...]
    straggler: str
    links: list[str]
    clocks: str | None
    """How the ranks' clocks were put together, where they differed."""


def _num(value: Any, digits: int, unit: str = "") -> str:
    return f"{value:.{digits}f}{unit}" if isinstance(value, (int, float)) and value == value else "-"


def _pct(share: Any) -> str:
    return _num(None if share is None else 100 * share, 0, "%")


def group_text(group: Any) -> str:
    """A process group as stored: its name or description and its ranks where the mapping has them."""
    if not isinstance(group, Mapping):
        return "-" if group is None else str(group)
    name = " ".join(str(group[k]) for k in ("name", "description") if group.get(k) is not None)
    ranks = group.get("ranks")
    members = f"ranks {ranks_text(ranks)}" if isinstance(ranks, list) else (
        f"{group['size']} ranks" if group.get("size") is not None else "")
    return " ".join(p for p in (name, f"({members})" if name and members else members) if p) or "-"


def _last(k: Mapping[str, Any]) -> str:
    last = k.get("last")
    if not isinstance(last, Mapping):
        return "none (no call has one last rank)" if "last" in k else "-"
    calls = k.get("calls") or last.get("of")
    share = f", {100 * last['calls'] / calls:.0f}% of calls" if calls else ""
    return f"rank {last.get('rank')}{share}"


def _bandwidth(k: Mapping[str, Any]) -> tuple[str, str]:
    if k.get("busbw_gb_s") is None:
        return "no payload bytes", "-"
    peak = k.get("link_peak_gb_s")
    of = "link peak unknown" if peak is None else f"{_pct(k.get('busbw_of_peak'))} of {peak:g} GB/s"
    return _num(k["busbw_gb_s"], 1), of


def _calls(k: Mapping[str, Any]) -> str:
    unmatched = k.get("unmatched")
    return f"{k.get('calls', '-')}" + (f" ({unmatched} unmatched)" if unmatched else "")


def straggler_text(s: Mapping[str, Any] | None) -> str:
    """The straggler named, with its evidence; or that none is, by what rule."""
    if not s:
        return f"No straggler named: {RULE}."
    group = s.get("group")
    of = f" in group {group_text(group)}" if group is not None else ""
    share = _pct(s.get("last_share"))
    return (f"Straggler: rank {s.get('rank')} arrived last in {share} of {s.get('calls')} {s.get('kind')} calls{of}, "
            f"a median {_num(s.get('skew_ms'), 1)} ms after the first rank ({RULE}).")


def _groups(across: Mapping[str, Any]) -> list[tuple[Any, Mapping[str, Any]]]:
    """(group, its kinds) as stored: `groups[]` where the import told process groups apart, else the one
    set of `kinds` of an import from before groups were."""
    if isinstance(across.get("groups"), list):
        return [({k: g.get(k) for k in ("name", "description", "ranks", "size")}, g.get("kinds") or {})
                for g in across["groups"] if isinstance(g, Mapping)]
    return [(None, across.get("kinds") or {})]


def across_ranks(summary: Mapping[str, Any]) -> AcrossRanks | None:
    """The table of a run whose traces matched collectives across two ranks or more; None otherwise."""
    across = (summary.get("trace") or {}).get("collectives_across_ranks") or {}
    groups = [(g, kinds) for g, kinds in _groups(across) if kinds]
    if not groups:
        return None
    grouped = across.get("groups_from") == "process_group" or len(groups) > 1
    headers = ["collective", *(["process group"] if grouped else []), "calls matched", "ranks", "skew p50 (ms)",
               "skew p90 (ms)", "last most often", "waiting", "bus bandwidth p50 (GB/s)", "of the link's peak"]
    rows = []
    for group, kinds in groups:
        for name, k in kinds.items():
            skew = k.get("skew_ms") or {}
            waiting = _pct(k.get("waiting_share"))
            if k.get("time_s") is not None and waiting != "-":
                waiting += f" of {k['time_s']:.3f} s"
            rows.append([name, *([group_text(group)] if grouped else []), _calls(k), str(k.get("ranks", "-")),
                         _num(skew.get("p50"), 2), _num(skew.get("p90"), 2), _last(k), waiting, *_bandwidth(k)])
    first = 2 if grouped else 1
    links = sorted({str(k["link"]) for _, kinds in groups for k in kinds.values() if k.get("link")})
    return AcrossRanks(headers, rows, (first, first + 1, first + 2, first + 3, first + 6),
                       straggler_text(across.get("straggler")), links, clocks_text(across.get("clocks")))
