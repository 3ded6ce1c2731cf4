"""What the store keeps when a run is not the tidy one-process-one-end kind: a finalize while it still
runs, a second attempt on its directory, a compaction cut short (Ctrl-C, a full disk), checkpoints among
damaged files, and run.json files that a newer glmperf or a damaged copy wrote."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from profiler import store
from profiler.analysis import load_run
from profiler.capture.ranks import run_rank
from profiler.capture.run import create_run_dir
from profiler.cli import main
from profiler.config import load_config
from reference_model.checkpoint import list_checkpoints, save_checkpoint
from tests.conftest import ROOT, TINY, RaiseAt, copy_run


def _glmperf(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """glmperf in this process: its exit code, stdout and stderr."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _parts(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "parts").glob("*.parquet"))


def _set(run_dir: Path, **fields: object) -> None:
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, **fields}))


def test_finalize_refuses_a_run_whose_process_is_alive(killed_run: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = copy_run(killed_run, tmp_path)
    with subprocess.Popen(["sleep", "60"]) as launcher:
        _set(run_dir, pid=launcher.pid, host=os.uname().nodename)
        before = (_parts(run_dir), (run_dir / "run.json").read_text())
        code, _, err = _glmperf(capsys, "finalize", str(run_dir))
        launcher.kill()
    assert code == 2
    assert _one_line(err) == (f"glmperf: error: run {run_dir.name} is still running (pid {launcher.pid}); "
                              "finalize it after it ends")
    assert (_parts(run_dir), (run_dir / "run.json").read_text()) == before  # nothing compacted, nothing marked
    assert not (run_dir / "steps.parquet").exists()


def test_compaction_merges_parts_flushed_after_it_and_counts_a_row_once(killed_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(killed_run, tmp_path)
    everything = store.read_table(run_dir, "steps")
    parts = sorted((run_dir / "parts").glob("steps-r*.parquet"))
    later, aside = parts[len(parts) // 2:], tmp_path / "aside"
    aside.mkdir()
    for p in later:  # flushed after the first compaction read the parts
        shutil.move(p, aside / p.name)
    early_copies = [shutil.copy(p, aside / f"copy-{p.name}") for p in parts[:len(parts) // 2]]
    store.compact(run_dir)
    for p in later:
        shutil.move(aside / p.name, p)
    for copy in early_copies:  # a compaction stopped after its write, before it removed the parts it read
        shutil.move(copy, run_dir / "parts" / Path(copy).name.removeprefix("copy-"))
    pd.testing.assert_frame_equal(store.read_table(run_dir, "steps"), everything)
    store.compact(run_dir)
    assert not list((run_dir / "parts").glob("steps-*")) and not list(run_dir.glob(".*.tmp"))
    pd.testing.assert_frame_equal(pd.read_parquet(run_dir / "steps.parquet"), everything)


def test_a_second_attempt_keeps_the_firsts_rows_and_the_latest_row_of_a_step_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(preset="tiny", overrides=[*TINY, "train.steps=4", "profile.trace=false"])
    run_dir = create_run_dir(cfg, runs_dir=tmp_path, nproc=1, launcher=False)  # as `glmperf init-run` makes it
    with pytest.raises(KeyboardInterrupt):  # requeued after its step 2
        run_rank(run_dir, cfg, device=torch.device("cpu"), progress=False,
                 extra_hooks=(RaiseAt(2, KeyboardInterrupt("requeued")),))
    run_rank(run_dir, cfg, device=torch.device("cpu"), progress=False)  # the same directory, started again
    steps = store.read_table(run_dir, "steps")
    assert sorted(zip(steps["attempt"], steps["step"], strict=True)) == \
        [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert {e["attempt"] for e in store.read_events(run_dir)[0]} <= {1, 2}
    code, _, err = _glmperf(capsys, "finalize", str(run_dir))
    assert code == 0, err
    record = store.read_run(run_dir)
    assert record["attempts"] == [
        {"attempt": 1, "first_step": 0, "last_step": 2, "steps": 3, "superseded_steps": 3},
        {"attempt": 2, "first_step": 0, "last_step": 3, "steps": 4, "superseded_steps": 0}]
    assert record["ranks"][0]["attempt"] == 2 and record["summary"]["steps_total"] == 4
    assert len(pd.read_parquet(run_dir / "steps.parquet")) == 7  # every attempt's rows stay on disk
    run = load_run(run_dir)
    assert set(run.steps["attempt"]) == {2} and any("later attempt" in n for n in run.merge_notes)


def _checkpoint(directory: Path, step: int) -> Path:
    path = directory / f"ckpt-{step:08d}.pt"
    torch.save({"step": step}, path)
    return path


def test_keep_last_k_counts_only_this_timelines_complete_checkpoints(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    older, stale = _checkpoint(directory, 10), _checkpoint(directory, 100)  # 100: a timeline given up
    (directory / "ckpt-00000012.pt").write_bytes(b"cut short")
    (directory / "ckpt-00000013.pt.123.tmp").write_bytes(b"a save a crash stopped")
    saved = save_checkpoint(directory, 14, {"step": 14}, keep=2)
    assert older.exists() and saved.exists()  # 10 and 14: the last two that count
    saved = save_checkpoint(directory, 16, {"step": 16}, keep=1)
    assert saved.exists() and torch.load(saved, weights_only=True) == {"step": 16}
    assert [s for s, _ in list_checkpoints(directory)] == [12, 16, 100]  # only what it counted was deleted
    assert stale.exists() and (directory / "ckpt-00000013.pt.123.tmp").exists()


def _full_disk(self: pd.DataFrame, path: Path, *args: object, **kwargs: object) -> None:
    Path(path).write_bytes(b"PAR1 half a table")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_during_finalize_is_one_line_and_keeps_every_row(
        killed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = copy_run(killed_run, tmp_path)
    rows = len(store.read_table(run_dir, "steps"))
    with monkeypatch.context() as patch:
        patch.setattr(pd.DataFrame, "to_parquet", _full_disk)
        code, _, err = _glmperf(capsys, "finalize", str(run_dir))
    assert code == 2
    assert _one_line(err) == f"glmperf: error: no space left on device writing {run_dir / 'steps.parquet'}"
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    assert len(store.read_table(run_dir, "steps")) == rows and store.read_run(run_dir)["status"] == "incomplete"
    code, _, err = _glmperf(capsys, "finalize", str(run_dir))  # space again: finalizing again finishes it
    assert code == 1 and store.read_run(run_dir)["summary"]["steps_total"] == rows


SIGINT_WHILE_WRITING = """
import os, signal, sys, time
import pandas as pd
from pathlib import Path
from profiler.cli import main

def interrupted(self, path, *args, **kwargs):
    Path(path).write_bytes(b"PAR1 half a table")
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)

pd.DataFrame.to_parquet = interrupted
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_during_finalize_exits_130_in_one_line_and_finalizing_again_finishes(
        killed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = copy_run(killed_run, tmp_path)
    rows = len(store.read_table(run_dir, "steps"))
    proc = subprocess.run([sys.executable, "-c", SIGINT_WHILE_WRITING, "finalize", str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted" in _one_line(proc.stderr) and "glmperf finalize again" in proc.stderr
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    assert len(store.read_table(run_dir, "steps")) == rows and store.read_run(run_dir)["status"] == "incomplete"
    code, _, _ = _glmperf(capsys, "finalize", str(run_dir))
    assert code == 1 and store.read_run(run_dir)["summary"]["steps_total"] == rows


def test_a_newer_schema_is_refused_with_what_to_do_and_listed_unreadable(
        completed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newer, fine = copy_run(completed_run, tmp_path), copy_run(completed_run, tmp_path / "other")
    fine = Path(shutil.move(fine, tmp_path / "fine"))
    _set(newer, schema_version=99)
    code, _, err = _glmperf(capsys, "show", str(newer))
    assert code == 2 and _one_line(err) == (f"glmperf: error: run {newer.name} was written by a newer glmperf "
                                            "(schema 99; this one reads up to 1): upgrade glmperf")
    listed = {Path(r["path"]): r for r in store.list_runs(tmp_path)}
    assert listed[newer]["status"] == "unreadable" and "upgrade glmperf" in listed[newer]["problems"][0]
    assert listed[fine]["status"] == "completed"


@pytest.mark.parametrize(("field", "value"), [("pid", "1234"), ("created", 5), ("summary", [1, 2]),
                                              ("ranks", [3]), ("world_size", True)])
def test_a_wrongly_typed_field_hides_no_other_run_and_is_one_line(
        completed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object) -> None:
    damaged, fine = copy_run(completed_run, tmp_path), copy_run(completed_run, tmp_path / "other")
    fine = Path(shutil.move(fine, tmp_path / "fine"))
    _set(damaged, status="running", **{field: value})  # `running`: what reads its pid as a process
    code, out, _ = _glmperf(capsys, "runs", "--runs-dir", str(tmp_path))
    assert code == 0 and "corrupt" in out and f"run.json: {field} " in out and fine.name in out
    code, out, err = _glmperf(capsys, "show", "completed", "--runs-dir", str(tmp_path))  # the name of both:
    assert code == 0 and "status                 completed" in out, err  # the damaged one (newer) passed by
    for args in (("show", str(damaged)), ("compare", str(damaged), "--vs", str(fine))):
        code, _, err = _glmperf(capsys, *args)
        assert code == 2 and f"{damaged / 'run.json'}: {field} " in _one_line(err) and "allowed: " in err


def test_bad_event_lines_are_skipped_and_counted(completed_run: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    good = (run_dir / "events.jsonl").read_bytes()
    (run_dir / "events.jsonl").write_bytes(good + b'\xff\xfe not utf-8\n[1, 2]\n"text"\n{"ts": "noon"}\n{"ts": 1')
    run = load_run(run_dir)
    assert run.events_skipped == 5 and len(run.events) == len(good.splitlines())
    assert _glmperf(capsys, "show", str(run_dir))[0] == 0


@pytest.mark.parametrize("damage", ["columns", "not parquet"])
def test_a_steps_table_that_is_not_one_is_one_line(completed_run: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str], damage: str) -> None:
    run_dir = copy_run(completed_run, tmp_path)
    if damage == "columns":
        pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}).to_parquet(run_dir / "steps.parquet")
    else:
        (run_dir / "steps.parquet").write_text("step,rank\n0,0\n")
    for command in ("show", "diagnose", "finalize"):
        code, _, err = _glmperf(capsys, command, str(run_dir))
        assert code == 2 and "steps.parquet" in _one_line(err), err


@pytest.mark.parametrize("ref", ["x" * 5000, "a\0b"], ids=["too-long", "nul-byte"])
def test_a_run_reference_no_path_can_hold_is_no_such_run(ref: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _glmperf(capsys, "show", ref, "--runs-dir", str(tmp_path))
    assert code == 2 and "no run " in _one_line(err)



END_CUT_SHORT = """
import errno, sys
from profiler import store
from profiler.cli.profile_run import main

def compact(run_dir):
    if sys.argv[1] == "ctrl-c":
        raise KeyboardInterrupt
    raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "steps.parquet"))

store.compact = compact
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(("fault", "code"), [("ctrl-c", 130), ("full-disk", 2)])
def test_profile_runs_own_end_cut_short_is_one_line_and_finalize_finishes_it(
        fault: str, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", END_CUT_SHORT, fault, "--preset", "tiny", "--steps", "4",
                           "--no-trace", "--no-progress", "--runs-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == code, proc.stderr
    line = _one_line(proc.stderr)
    [run_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert "not finalized" in line and f"glmperf finalize {run_dir.name}" in line
    assert len(store.read_table(run_dir, "steps")) == 4
    assert _glmperf(capsys, "finalize", str(run_dir))[0] == 0
    assert store.read_run(run_dir)["summary"]["steps_total"] == 4


def test_finalize_removes_the_temp_file_a_killed_writer_left(killed_run: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # SIGKILL between writing a part and renaming it leaves `.<name>.<pid>.<hex>.tmp`
    run_dir = copy_run(killed_run, tmp_path)
    (rank,) = store.read_rank_statuses(run_dir)  # the killed process
    stale = run_dir / "parts" / f".steps-r0-a1-000099.parquet.{rank['pid']}.0abc12.tmp"
    stale.write_bytes(b"half a parquet file")
    unknown = run_dir / "parts" / f".steps-r0-a1-000100.parquet.{os.getpid()}.0abc13.tmp"  # no rank's: kept
    unknown.write_bytes(b"another writer's")
    code, _, err = _glmperf(capsys, "finalize", str(run_dir))
    assert code == 1, err  # finalized; the run did not complete
    assert not stale.exists() and unknown.exists()
