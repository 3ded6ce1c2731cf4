"""What `glmperf report` and `glmperf dashboard` refuse to touch or show, on real tiny runs: an output
that is not a regular file, a file name built from a stored id, a run directory outside the runs
directory, a full disk or a Ctrl-C mid-write; a dashboard reachable beyond this machine, serving what
lies outside its runs directory, or showing a traceback or a server path."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from app import jobs
from profiler import store
from profiler.cli import main
from tests.conftest import ROOT, copy_run
from tests.dashboard_server import CLI, serving
from tests.test_dashboard import page, texts
from tests.test_report_pages import write_sweep


def set_id(run_dir: Path, run_id: str) -> None:
    """Give the run's run.json another `id`, as a crafted or damaged record could hold."""
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, "id": run_id}))


def one_line(err: str, *says: str) -> None:
    assert err.count("\n") == 1 and err.endswith("\n"), err
    for text in says:
        assert text in err, (text, err)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture
def runs(tmp_path: Path, completed_run: Path) -> tuple[Path, Path]:
    """A runs directory with a copy of the completed run, whose report.html holds an old report."""
    root = tmp_path / "runs"
    root.mkdir()
    run_dir = copy_run(completed_run, root)
    (run_dir / "report.html").write_text("old report")
    return root, run_dir


# -- item: what -o names --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_an_output_that_is_not_a_regular_file_is_refused(kind: str, completed_run: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    elif os.geteuid() == 0:
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is, in a temp dir
    else:
        pytest.skip("making a device node needs root")
    before = os.lstat(target)
    assert main(["report", str(completed_run), "-o", str(target)]) == 2
    one_line(capsys.readouterr().err, "glmperf: error: ", str(target), "not a regular file", "allowed:")
    after = os.lstat(target)
    assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino)
    assert [p.name for p in tmp_path.iterdir()] == ["target"]  # no temp left beside it


def test_an_output_symlink_is_refused_and_left_as_it_is(completed_run: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target.html"
    target.write_text("kept")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    assert main(["report", str(completed_run), "-o", str(link)]) == 2
    one_line(capsys.readouterr().err, "glmperf: error: ", str(link), "symbolic link", str(target))
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_text() == "kept"
    assert leftovers(tmp_path) == []


def test_a_report_over_a_regular_file_keeps_its_mode(completed_run: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    out.write_text("old")
    out.chmod(0o600)
    assert main(["report", str(completed_run), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out}"
    assert out.read_text().startswith("<!doctype html>") and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert leftovers(tmp_path) == []


# -- item: file names from stored data -----------------------------------------------------------

@pytest.mark.parametrize("stored", ["x/../../../../escape-target", "../..", "..", ".hidden", "a\\b", "", "/",
                                    "é/\0\n", "x" * 500, "-rf"])
def test_a_stored_string_becomes_a_plain_file_name(stored: str) -> None:
    from reports.paths import plain_name

    name = plain_name(stored)
    assert name and len(name) <= 80 and not name.startswith((".", "-")) and ".." not in name
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name), name
    assert plain_name("20260101-000000-tiny-abc123") == "20260101-000000-tiny-abc123"


def test_compare_default_file_name_stays_in_the_working_directory(completed_run: Path, two_rank_run: Path,
                                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    base, cand = copy_run(completed_run, root), copy_run(two_rank_run, root)
    set_id(base, "x/../../../../escape-target")
    cwd = tmp_path / "a" / "b" / "c" / "d"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    assert main(["report", "--compare", str(base), str(cand), "--runs-dir", str(root)]) == 0
    (written,) = cwd.iterdir()
    assert capsys.readouterr().out.strip() == f"report: {written.name}"
    assert written.is_file() and written.name.startswith("compare-x-") and written.name.endswith(
        f"-vs-{cand.name}.html")
    assert not [p for p in tmp_path.rglob("*escape-target*") if p != written]


# -- item: run directories outside the runs directory --------------------------------------------

def test_report_will_not_write_into_a_run_directory_outside_the_runs_directory(
        runs: tuple[Path, Path], completed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, inside = runs
    (tmp_path / "outside").mkdir()
    outside = copy_run(completed_run, tmp_path / "outside")
    (outside / "report.html").unlink(missing_ok=True)
    (root / "linked").symlink_to(outside)
    for ref in ("linked", str(root / "linked"), str(outside), f"{inside.name}/../../outside/{outside.name}"):
        assert main(["report", ref, "--runs-dir", str(root)]) == 2, ref
        one_line(capsys.readouterr().err, "glmperf: error: ", "-o FILE")
        assert not (outside / "report.html").exists(), ref
    elsewhere = tmp_path / "elsewhere.html"
    assert main(["report", "linked", "--runs-dir", str(root), "-o", str(elsewhere)]) == 0
    assert elsewhere.read_text().startswith("<!doctype html>")
    capsys.readouterr()

    victim = tmp_path / "victim.txt"  # a report.html inside a run that points elsewhere
    victim.write_text("kept")
    (inside / "report.html").unlink()
    (inside / "report.html").symlink_to(victim)
    assert main(["report", inside.name, "--runs-dir", str(root)]) == 2
    one_line(capsys.readouterr().err, "glmperf: error: ", "symbolic link")
    assert victim.read_text() == "kept" and (inside / "report.html").is_symlink()


def test_sweep_report_will_not_write_into_a_sweep_directory_outside_the_runs_directory(
        runs: tuple[Path, Path], completed_run: Path, two_rank_run: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = runs
    sweep_dir = write_sweep(tmp_path / "elsewhere", [completed_run, two_rank_run]).parent
    (root / "sweeps").mkdir()
    (root / "sweeps" / "sweep-1").symlink_to(sweep_dir)
    for ref in ("sweep-1", str(sweep_dir)):
        assert main(["report", "--sweep", ref, "--runs-dir", str(root)]) == 2, ref
        one_line(capsys.readouterr().err, "glmperf: error: ", "-o FILE")
    assert not (sweep_dir / "report.html").exists()


# -- item: a full disk or a Ctrl-C while the report is written -----------------------------------

def _small_files() -> None:
    """A file size limit under a report's size: the write fails as on a full disk (EFBIG, not killed)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_a_failed_write_is_one_line_and_keeps_the_old_report(runs: tuple[Path, Path]) -> None:
    root, run_dir = runs
    done = subprocess.run([sys.executable, "-c", CLI, "report", run_dir.name, "--runs-dir", str(root)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, preexec_fn=_small_files)
    assert done.returncode == 2, done.stderr
    one_line(done.stderr, f"glmperf: error: cannot write {run_dir / 'report.html'}", "File too large")
    assert (run_dir / "report.html").read_text() == "old report" and leftovers(run_dir) == []


def test_ctrl_c_while_the_report_is_written_is_one_line_and_keeps_the_old_report(
        runs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    root, run_dir = runs
    replace = os.replace

    def ctrl_c_then_replace(src: str, dst: str) -> None:  # a real SIGINT while the temp file is there
        signal.raise_signal(signal.SIGINT)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", ctrl_c_then_replace)
    assert main(["report", run_dir.name, "--runs-dir", str(root)]) == 130
    one_line(capsys.readouterr().err, f"report interrupted: {run_dir / 'report.html'} is as it was")
    assert (run_dir / "report.html").read_text() == "old report" and leftovers(run_dir) == []


# -- item: the dashboard ------------------------------------------------------------------------

@contextmanager
def dashboard(tmp_path: Path, *args: str) -> Iterator[tuple[psutil.Process, int, Path]]:
    """A real `glmperf dashboard` over an empty runs directory, until it answers on 127.0.0.1."""
    log = tmp_path / f"dashboard-{len(list(tmp_path.glob('dashboard-*')))}.log"
    with serving(tmp_path / "runs", log, *args) as (server, port):
        yield psutil.Process(server.pid), port, log


def listening(process: psutil.Process, port: int) -> set[str]:
    return {c.laddr.ip for c in process.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


@pytest.mark.slow
def test_the_dashboard_listens_on_localhost_unless_told_otherwise(tmp_path: Path) -> None:
    with dashboard(tmp_path) as (server, port, log):
        assert listening(server, port) == {"127.0.0.1"}
        assert "no login" not in log.read_text()
    with dashboard(tmp_path, "--host", "0.0.0.0") as (server, port, log):
        assert listening(server, port) == {"0.0.0.0"}
        assert ("dashboard: serving on 0.0.0.0 with no login: anyone who can reach this port can read the runs "
                "and start runs") in log.read_text()


@pytest.fixture
def served(runs: tuple[Path, Path], completed_run: Path, tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """The runs directory, its one run, and `?run=` values naming what lies outside it: a run outside, a
    symlink inside to it, a path out, a system directory, a path that does not exist."""
    root, inside = runs
    (tmp_path / "outside").mkdir()
    outside = copy_run(completed_run, tmp_path / "outside")
    (root / "linked").symlink_to(outside)
    return root, inside, [str(outside), "linked", str(root / "linked"), f"../outside/{outside.name}", "/etc",
                          "/nonexistent", "../../../../etc", "x" * 5000]


def test_the_dashboard_serves_only_runs_inside_its_runs_directory(served: tuple[Path, Path, list[str]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root, inside, refs = served
    answers = set()
    for name in ("run", "recommend"):
        for ref in refs:
            at = page(root, monkeypatch, name, run=ref)
            answers.add(texts(at, "error").replace(repr(ref), "REF"))
            assert not at.header and not at.get("plotly_chart") and not at.button, (name, ref)
        at = page(root, monkeypatch, name, run=inside.name)  # the run inside is served
        assert not at.error and (name != "run" or at.get("plotly_chart")), name
    assert answers == {"no run REF in this runs directory (the Runs page lists them)"}
    listed = page(root, monkeypatch).dataframe[0].value
    assert list(listed["run"]) == [inside.name]  # the symlinked run is not listed either


def test_a_verification_is_only_started_for_a_run_inside_the_runs_directory(served: tuple[Path, Path, list[str]]
                                                                           ) -> None:
    root, _, refs = served
    for ref in refs:
        with pytest.raises(store.StoreError, match="no run"):
            jobs.start(ref, root, top=1, repeats=1, steps=1)
    assert not (root / jobs.JOBS_DIR).exists()


def test_dashboard_pages_show_no_server_path(served: tuple[Path, Path, list[str]], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    root, inside, _ = served
    corrupt = root / "20260101-000000-badjson-000000"  # its error names its run.json
    corrupt.mkdir()
    (corrupt / "run.json").write_text("{")
    shown = []
    for name, params in (("runs", {}), ("run", {"run": inside.name}), ("run", {"run": corrupt.name}),
                         ("recommend", {"run": inside.name}), ("compare", {})):
        at = page(root, monkeypatch, name, **params)
        shown += [texts(at, "title", "header", "markdown", "caption", "error", "warning", "info", "code"),
                  *(d.value.to_csv() for d in at.dataframe)]
    text = "\n".join(shown)
    assert "not valid JSON" in text and "sweeps" in text  # what is wrong, and where, is still said ...
    assert str(tmp_path) not in text and str(ROOT) not in text  # ... with no path of the server's


def test_a_page_that_fails_shows_one_message_and_no_traceback(runs: tuple[Path, Path], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = runs

    def fails(runs_dir: Path) -> list[dict[str, object]]:  # a fault no input reaches any more, injected
        raise RuntimeError(f"listing {runs_dir} failed at {tmp_path}")

    monkeypatch.setattr(store, "list_runs", fails)
    for name in ("runs", "run", "compare", "recommend"):
        at = page(root, monkeypatch, name)
        assert texts(at, "error") == "This page could not be shown; the dashboard's log says why.", name
        assert not at.exception and str(tmp_path) not in texts(at, "error", "markdown", "caption", "code"), name


def test_the_run_page_offers_only_the_runs_own_trace_files(runs: tuple[Path, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root, inside = runs
    secret = tmp_path / "secret.json.gz"
    secret.write_bytes(b"not the run's")
    (inside / "traces").mkdir(exist_ok=True)
    (inside / "traces" / "rank7.json.gz").symlink_to(secret)  # a link in a run's traces to a file elsewhere
    labels = [b.label for b in page(root, monkeypatch, "run", run=inside.name).get("download_button")]
    assert labels[0] == "HTML report" and "trace rank7.json.gz" not in labels


def test_a_verification_shows_and_writes_only_its_own_log(runs: tuple[Path, Path], tmp_path: Path) -> None:
    root, inside = runs
    secret = tmp_path / "secret.txt"
    secret.write_text("not the job's\n")
    folder = root / jobs.JOBS_DIR
    folder.mkdir()
    record = folder / f"verify-{inside.name}.json"  # a record naming a log elsewhere
    record.write_text(json.dumps({"run": inside.name, "pid": 1, "started": 0.0, "command": [], "log": str(secret)}))
    job = jobs.find(inside.name, root)
    assert job is not None and "not the job's" not in job.tail()
    (folder / f"verify-{inside.name}.log").symlink_to(secret)  # a log that is a link elsewhere
    assert jobs.find(inside.name, root) is None
    with pytest.raises(OSError):
        jobs.start(inside.name, root, top=1, repeats=1, steps=1)
    assert secret.read_text() == "not the job's\n"
