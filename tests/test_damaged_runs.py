"""Every read command against run directories damaged at random: an answer (exit 0, 1 or 2), never a
traceback, and one damaged run never hides the others.

The damaged runs are copies of one real tiny run (conftest's `completed_run`), each damaged in one or two
ways drawn by random.Random(seed): run.json truncated, garbled, with a field of the wrong type or a newer
schema; a table that is garbage, cut short, of the wrong columns, or missing; events.jsonl with bad lines;
a file gone. The commands run in this process (glmperf's `main`) to keep the test short.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from profiler import store
from profiler.cli import main

WRONG_VALUES: tuple[object, ...] = ("text", 7, 2.5, True, [1, "a"], {"a": 1}, -1)
TABLE_FILES = ("steps.parquet", "samples.parquet", "ops.parquet")


def _record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _write_record(run_dir: Path, record: dict) -> None:
    (run_dir / "run.json").write_text(json.dumps(record))


def _truncate(rng: random.Random, path: Path) -> str:
    data = path.read_bytes()
    path.write_bytes(data[:rng.randrange(len(data))])
    return f"{path.name} truncated"


def _garble(rng: random.Random, path: Path) -> str:
    data = bytearray(path.read_bytes())
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    path.write_bytes(bytes(data))
    return f"{path.name} garbled"


def _wrong_type(rng: random.Random, run_dir: Path) -> str:
    record = _record(run_dir)
    key = rng.choice(sorted(record))
    record[key] = rng.choice([v for v in WRONG_VALUES if type(v) is not type(record[key])])
    _write_record(run_dir, record)
    return f"run.json {key}={record[key]!r}"


def _newer_schema(rng: random.Random, run_dir: Path) -> str:
    _write_record(run_dir, {**_record(run_dir), "schema_version": 99})
    return "schema 99"


def _bad_table(rng: random.Random, run_dir: Path) -> str:
    path = run_dir / rng.choice(TABLE_FILES)
    how = rng.choice(["garbage", "truncated", "columns", "csv"])
    if how == "garbage":
        path.write_bytes(rng.randbytes(rng.randint(0, 300)))
    elif how == "truncated":
        _truncate(rng, path)
    elif how == "columns":
        pd.DataFrame({"x": [1, 2], "step": ["a", "b"]}).to_parquet(path)
    else:
        path.write_text("step,rank\n0,0\n")
    return f"{path.name} {how}"


def _bad_events(rng: random.Random, run_dir: Path) -> str:
    lines = [b"\xff\xfe\x00", b"[1, 2]", b'"text"', b"42", b'{"ts": "noon"}', b'{"ts": 1', b"null"]
    with open(run_dir / "events.jsonl", "ab") as f:
        f.write(b"\n".join(rng.sample(lines, rng.randint(1, len(lines)))) + b"\n")
    return "events.jsonl bad lines"


def _missing(rng: random.Random, run_dir: Path) -> str:
    path = run_dir / rng.choice(["run.json", "events.jsonl", "traces", "parts", *TABLE_FILES])
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    return f"{path.name} missing"


DAMAGES: tuple[Callable[[random.Random, Path], str], ...] = (
    lambda rng, d: _truncate(rng, d / "run.json"), lambda rng, d: _garble(rng, d / "run.json"),
    _wrong_type, _wrong_type, _newer_schema, _bad_table, _bad_events, _missing)


def _damaged(base: Path, dest: Path, rng: random.Random, count: int) -> list[tuple[Path, str]]:
    """`count` copies of `base` under `dest`, each damaged in one or two ways, with what was done."""
    out = []
    for i in range(count):
        run_dir = Path(shutil.copytree(base, dest / f"{base.name}-{i}"))
        done = []
        for damage in rng.sample(DAMAGES, rng.randint(1, 2)):
            with contextlib.suppress(FileNotFoundError, ValueError):  # of a file an earlier one removed or garbled
                done.append(damage(rng, run_dir))
        out.append((run_dir, ", ".join(done)))
    return out


def _glmperf(*args: str) -> tuple[int, str]:
    """glmperf in this process: its exit code and stderr (an exception raised out of main fails the test)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return code, err.getvalue()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_every_read_command_answers_a_damaged_run_without_a_traceback(
        completed_run: Path, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    runs_dir = tmp_path / "runs"
    good = Path(shutil.copytree(completed_run, runs_dir / "good"))
    damaged = _damaged(completed_run, runs_dir, rng, 6)
    code, err = _glmperf("runs", "--runs-dir", str(runs_dir))
    assert code == 0 and "Traceback" not in err, (seed, [d for _, d in damaged], err)
    listed = {Path(r["path"]): r for r in store.list_runs(runs_dir)}
    assert listed[good]["status"] == "completed"  # no damaged run hides it
    for run_dir, what in damaged:
        for args in (["show", str(run_dir)], ["diagnose", str(run_dir)], ["recommend", str(run_dir)],
                     ["compare", str(good), "--vs", str(run_dir)], ["report", str(run_dir), "-o",
                                                                     str(tmp_path / "report.html")],
                     ["show", "completed", "--runs-dir", str(runs_dir)], ["finalize", str(run_dir)]):
            code, err = _glmperf(*args)
            assert code in (0, 1, 2) and "Traceback" not in err, (seed, what, args, code, err)
            if code == 2:
                assert len(err.strip().splitlines()) == 1, (what, args, err)
