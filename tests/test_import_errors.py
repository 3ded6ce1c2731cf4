"""glmperf import on bad input: each malformed, truncated or empty trace gives one clear error naming
the file and what is wrong; a directory with one bad rank file imports the others and says which."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from profiler import store
from profiler.cli import main

GOOD = Path("/work/shared/data/traces/a100_2rank_nccl/rank-0.json.gz")
ROOT = Path(__file__).resolve().parent.parent


def _bad(kind: str, path: Path) -> Path:
    """A trace file broken as `kind`, from the real one."""
    raw = gzip.decompress(GOOD.read_bytes())
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated json":
        path.write_bytes(raw[: len(raw) // 2])
    elif kind == "truncated gzip":
        path.write_bytes(gzip.compress(raw)[: 200_000])
    elif kind == "malformed":
        cut = raw.index(b"},", len(raw) // 3) + 2  # between two events, in the middle of the file
        path.write_bytes(raw[:cut] + b" not json, " + raw[cut:])
    elif kind == "not a trace":
        path.write_bytes(b'{"hello": [1, 2, 3]}')
    return path


CASES = {"empty": ("rank-1.json", "the file is empty"),
         "truncated json": ("rank-1.json", "truncated"),
         "truncated gzip": ("rank-1.json.gz", "gzip stream is truncated"),
         "malformed": ("rank-1.json", "not valid JSON"),
         "not a trace": ("rank-1.json", "no complete events")}


@pytest.mark.skipif(not GOOD.exists(), reason="the shared traces are not on this machine")
@pytest.mark.parametrize("kind", CASES)
def test_a_bad_trace_alone_is_one_clear_error(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, what = CASES[kind]
    traces = tmp_path / "traces"
    traces.mkdir()
    bad = _bad(kind, traces / name)
    assert main(["import", str(traces), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glmperf: error: ")
    assert str(bad) in err[0] and what in err[0], err[0]
    assert store.list_runs(tmp_path / "runs") == []


@pytest.mark.skipif(not GOOD.exists(), reason="the shared traces are not on this machine")
def test_one_bad_rank_file_is_left_out_and_named(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(GOOD, traces / "rank-0.json.gz")
    bad = _bad("truncated json", traces / "rank-1.json")
    done = subprocess.run([sys.executable, "-c", "import sys; from profiler.cli import main; sys.exit(main())",
                           "import", str(traces), "--runs-dir", str(tmp_path / "runs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert f"left out {bad}" in done.stderr and "truncated" in done.stderr
    (run,) = store.list_runs(tmp_path / "runs")
    assert run["world_size"] == 1 and list(run["import"]["files"]) == ["0"]
    assert run["import"]["failed"][0]["file"] == str(bad)


def test_no_directory_and_no_traces_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(tmp_path / "nowhere"), "--runs-dir", str(tmp_path)]) == 2
    assert "nowhere does not exist: give a trace file or a directory of them" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not a trace")
    assert main(["import", str(tmp_path / "notes.txt"), "--runs-dir", str(tmp_path)]) == 2
    assert "notes.txt is not a chrome trace (*.json, *.json.gz)" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["import", str(tmp_path / "empty"), "--runs-dir", str(tmp_path)]) == 2
    assert "no chrome traces" in capsys.readouterr().err
