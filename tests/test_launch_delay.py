"""The launch delay (profiler.traces.launches) pinned to a hand computation from a real trace's JSON: the
shared 16-rank A100 job's rank 0, whose median delay is 164 ms of a 216 ms step. It is the trace's own:
HTA reads the same, and the clocks agree (a side stream's kernels start within a millisecond of their launch),
so it is work queued behind the busy stream, not a unit or pairing error; the 2-step tiled copies
(benchmarks/import_ranks.tile_ranks) read as their own JSON says."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from benchmarks.import_ranks import tile_ranks
from profiler.traces.summary import analyze_traces
from profiler.traces.window import LAUNCHES

SOURCE = Path("/work/shared/data/traces/a100_16rank/rank-0.json.gz")
HTA = Path(__file__).parent / "data" / "traces_hta" / "hta_figures.json"
MAIN, SIDE = 7, 27
"""The job's busiest stream (its compute kernels) and a side stream the host waits on."""

pytestmark = pytest.mark.skipif(not SOURCE.exists(), reason="the shared traces are not on this machine")


def by_hand(path: Path) -> dict[int, list[float]]:
    """Each launched GPU event's delay (us) by its stream, straight from the JSON: its `ts` minus its launch
    call's end, the call found by `args.correlation`, at least 0; in HTA's window: no launch from the last
    ProfilerStep's start on (the trace may end inside it)."""
    events = [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    cut = max(e["ts"] for e in events if e["name"].startswith("ProfilerStep#"))
    calls = {e["args"]["correlation"]: e for e in events
             if e["name"] in LAUNCHES and e["ts"] < cut and "stream" not in e.get("args", {})}
    delays: dict[int, list[float]] = defaultdict(list)
    for e in events:
        call = calls.get(e.get("args", {}).get("correlation")) if "stream" in e.get("args", {}) else None
        if call is not None:
            delays[e["args"]["stream"]].append(max(0.0, e["ts"] - (call["ts"] + call["dur"])))
    return delays


def _figures(delays: dict[int, list[float]]) -> dict[str, Any]:
    every = [d for ds in delays.values() for d in ds]
    return {"launches": len(every), "p50": statistics.median(every), "mean": statistics.fmean(every),
            "p90": float(np.quantile(every, 0.9))}


def test_the_figure_is_the_json_s_own_and_htas() -> None:
    ours = analyze_traces([SOURCE]).summary()["ranks"]["0"]
    hand = _figures(by_hand(SOURCE))
    assert ours["launches"] == hand["launches"] == 5224
    assert ours["launch_delay_us"] == pytest.approx({k: hand[k] for k in ("mean", "p50", "p90")}, abs=1e-6)
    assert hand["p50"] == 163_575.5  # us: 164 ms
    hta = json.loads(HTA.read_text())["traces"]["a100_16rank"]["0"]["launch_delay_us"]
    assert hta == pytest.approx({"mean": hand["mean"], "p50": hand["p50"]}, abs=1e-6)


def test_it_is_queueing_on_the_busy_stream_not_the_clocks() -> None:
    delays = by_hand(SOURCE)
    assert min(delays[MAIN]) > 37_000 and statistics.median(delays[MAIN]) > 160_000  # every one waits
    assert statistics.median(delays[SIDE]) < 200 and min(delays[SIDE]) == 0  # same clocks: no offset to blame


def test_the_tiled_copies_read_as_their_json(tmp_path: Path) -> None:
    files = tile_ranks(SOURCE, tmp_path, 2, steps=2)
    hand = _figures(by_hand(files[0]))
    ranks = analyze_traces(files).summary()["ranks"]
    for rank in ("0", "1"):
        assert ranks[rank]["launches"] == hand["launches"]
        assert ranks[rank]["launch_delay_us"]["p50"] == pytest.approx(hand["p50"], abs=1e-6)
    assert hand["p50"] == pytest.approx(_figures(by_hand(SOURCE))["p50"], rel=0.01)  # one step as the four
