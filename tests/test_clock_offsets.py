"""Ranks on hosts whose clocks differ (profiler.traces.collective_skew.clock_offsets) on a real trace: the
shared 16-rank A100 job's rank 0 (its first two steps) tiled as three ranks.

A clock ahead: rank 2's every event AHEAD_US later and nothing else changed, as its host's clock would
write them; its collectives still end with the others'. Read on the traces' own clocks it would arrive
AHEAD_US late at every call and be named the straggler; measured by the calls' ends, its offset is AHEAD_US
and it is not late. A rank that is really late (every event DELAY_US later, the others' NCCL kernels
DELAY_US longer: they wait for it inside them) keeps its lateness, with or without its clock's offset."""

from __future__ import annotations

import contextlib
import gzip
import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks.import_ranks import tile_ranks
from profiler.cli import main
from profiler.traces.collective_skew import CLOCK_TOLERANCE_US
from profiler.traces.summary import analyze_traces

SOURCE = Path("/work/shared/data/traces/a100_16rank/rank-0.json.gz")
RANKS, ODD = 3, 2
AHEAD_US = 5e6
"""5 s: far beyond any skew of the job's own, as a host whose clock NTP has not caught up."""
DELAY_US = 20_000.0
"""20 ms: about 9% of the trace's step, over what names a straggler."""

pytestmark = pytest.mark.skipif(not SOURCE.exists(), reason="the shared traces are not on this machine")


def _rewrite(path: Path, shift_us: float, waits_us: float) -> None:
    trace = orjson.loads(gzip.decompress(path.read_bytes()))
    for event in trace["traceEvents"]:
        event["ts"] += shift_us
        if event.get("cat") == "kernel" and event.get("name", "").startswith("nccl"):
            event["dur"] += waits_us
    path.write_bytes(gzip.compress(orjson.dumps(trace), compresslevel=1))


def _files(root: Path, ahead_us: float, late_us: float) -> list[Path]:
    """The three copies, rank ODD's clock `ahead_us` ahead and rank ODD `late_us` late."""
    files = tile_ranks(SOURCE, root, RANKS, steps=2)
    for rank, path in enumerate(files):
        _rewrite(path, ahead_us + late_us, 0.0) if rank == ODD else _rewrite(path, 0.0, late_us)
    return files


def _job(root: Path, ahead_us: float, late_us: float) -> dict[str, Any]:
    """summary.trace.collectives_across_ranks of `_files`."""
    return analyze_traces(_files(root, ahead_us, late_us)).summary()["collectives_across_ranks"]


def _kinds(across: dict[str, Any]) -> dict[str, Any]:
    (group,) = across["groups"]
    return group["kinds"]


def test_a_host_clock_ahead_is_measured_and_not_taken_for_a_straggler(tmp_path: Path) -> None:
    across = _job(tmp_path, AHEAD_US, 0.0)
    clocks = across["clocks"]
    assert clocks["aligned"] and clocks["calls"] > 0
    assert clocks["offsets_us"] == {"0": pytest.approx(0.0, abs=1e-3), "1": pytest.approx(0.0, abs=1e-3),
                                    str(ODD): pytest.approx(AHEAD_US, abs=1e-3)}
    assert "straggler" not in across
    for k in _kinds(across).values():
        assert k["skew_ms"]["max"] == pytest.approx(0.0, abs=1e-3) and k["last"] is None, k


def test_copies_on_one_clock_are_left_as_they_are(tmp_path: Path) -> None:
    clocks = _job(tmp_path, 0.0, 0.0)["clocks"]
    assert not clocks["aligned"] and set(clocks["offsets_us"].values()) == {0.0}


@pytest.mark.parametrize("ahead_us", [0.0, AHEAD_US])
def test_a_late_rank_stays_late_whatever_its_clock(tmp_path: Path, ahead_us: float) -> None:
    across = _job(tmp_path, ahead_us, DELAY_US)
    offsets = across["clocks"]["offsets_us"]
    assert offsets[str(ODD)] == pytest.approx(ahead_us, abs=CLOCK_TOLERANCE_US)
    assert across["clocks"]["aligned"] == (ahead_us > 0)
    assert across["straggler"]["rank"] == ODD and across["straggler"]["last_share"] == 1.0
    assert across["straggler"]["skew_ms"] == pytest.approx(DELAY_US / 1e3, abs=1e-3)
    for k in _kinds(across).values():
        assert k["skew_ms"]["p50"] == pytest.approx(DELAY_US / 1e3, abs=1e-3)


def test_import_and_the_report_say_the_clocks_were_put_together(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    _files(tmp_path / "traces", AHEAD_US, 0.0)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["import", str(tmp_path / "traces"), "--runs-dir", str(tmp_path / "runs"), "--workers", "1"]) == 0
        (run,) = (tmp_path / "runs").iterdir()
        assert main(["report", str(run), "-o", str(tmp_path / "report.html")]) == 0
    said = f"rank {ODD} +{AHEAD_US / 1e3:.3f} ms); starts were put on one clock before their skew was read."
    assert "clocks: The ranks' clocks differ" in printed.getvalue() and said in printed.getvalue()
    assert "straggler:" not in printed.getvalue()
    assert said in (tmp_path / "report.html").read_text(encoding="utf-8")
