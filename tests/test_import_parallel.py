"""glmperf import of many ranks at once: a 32-rank job (a real trace tiled, each copy saying its own rank)
read by two worker processes, or by a Dask cluster, is the run one process makes of it; a damaged rank
file among them is left out and named; a bad --workers or --scheduler is one line before any work."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from benchmarks.import_ranks import SOURCE, tile_ranks
from profiler import store
from profiler.traces import parallel
from tests.conftest import glmperf

RANKS = 32
TABLES = ("steps", "ops", "kernels")
SAID = ("id", "created", "ended", "path")
"""What differs between two imports of the same traces, besides how they were read."""

pytestmark = pytest.mark.skipif(not SOURCE.exists(), reason="the shared traces are not on this machine")


def imported(trace_dir: Path, runs: Path, *options: str) -> tuple[dict[str, Any], str]:
    """The run `glmperf import` made of `trace_dir` with `options`, and its stderr."""
    done = glmperf("import", str(trace_dir), "--runs-dir", str(runs), *options)
    assert done.returncode == 0, done.stderr
    (run,) = store.list_runs(runs)
    return run, done.stderr


def without_how(run: dict[str, Any]) -> dict[str, Any]:
    """The run's record less what says when and how it was read."""
    read = {k: v for k, v in run["import"].items() if k not in ("workers", "scheduler")}
    return {**{k: v for k, v in run.items() if k not in SAID}, "import": read}


def assert_same(run: dict[str, Any], serial: dict[str, Any]) -> None:
    """The same record, figures and diagnosis, and the same tables, row for row."""
    assert without_how(run) == without_how(serial)
    for table in TABLES:
        pd.testing.assert_frame_equal(store.read_table(Path(run["path"]), table),
                                      store.read_table(Path(serial["path"]), table))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 ranks of the shared A100 trace's first step (8 MB of gzip)."""
    out = tmp_path_factory.mktemp("job")
    tile_ranks(SOURCE, out, RANKS, steps=1)
    return out


@pytest.fixture(scope="module")
def serial(job: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run, _ = imported(job, tmp_path_factory.mktemp("serial"), "--workers", "1")
    assert run["import"]["workers"] == 1 and run["import"]["scheduler"] == "processes"
    return run


def test_two_worker_processes_make_the_run_one_process_makes(job: Path, serial: dict[str, Any],
                                                             tmp_path: Path) -> None:
    run, err = imported(job, tmp_path, "--workers", "2")
    assert run["world_size"] == RANKS and run["import"]["failed"] == []
    assert sorted(map(int, run["import"]["files"])) == list(range(RANKS))
    assert sorted(map(int, run["summary"]["trace"]["ranks"])) == list(range(RANKS))
    assert run["import"]["workers"] == 2 and run["import"]["scheduler"] == "processes"
    assert_same(run, serial)
    progress = [line for line in err.splitlines() if line.startswith("  read rank ")]
    assert len(progress) == RANKS and progress[-1].endswith(f"({RANKS} of {RANKS}) ...")


def test_a_dask_cluster_makes_the_same_run(job: Path, serial: dict[str, Any], tmp_path: Path) -> None:
    """`--scheduler local`: a LocalCluster the import starts; an address: the scheduler of one already running."""
    from dask.distributed import LocalCluster

    run, _ = imported(job, tmp_path / "local", "--scheduler", "local", "--workers", "2")
    assert run["import"]["workers"] == 2 and run["import"]["scheduler"] == "local"
    assert_same(run, serial)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        run, _ = imported(job, tmp_path / "address", "--scheduler", cluster.scheduler_address)
    assert run["import"]["workers"] == 2 and run["import"]["scheduler"] == cluster.scheduler_address
    assert_same(run, serial)


def test_a_damaged_rank_file_is_left_out_and_named_the_rest_read_in_parallel(
        job: Path, serial: dict[str, Any], tmp_path: Path) -> None:
    traces = Path(shutil.copytree(job, tmp_path / "traces"))
    damaged = traces / "rank-7.json.gz"
    damaged.write_bytes(damaged.read_bytes()[:100_000])
    run, err = imported(traces, tmp_path / "runs", "--workers", "2")
    assert f"glmperf: warning: left out {damaged}" in err and "truncated" in err
    assert [f["file"] for f in run["import"]["failed"]] == [str(damaged)]
    assert run["world_size"] == RANKS - 1 and "7" not in run["import"]["files"]
    ranks, whole = run["summary"]["trace"]["ranks"], serial["summary"]["trace"]["ranks"]
    assert ranks == {r: {**f, "file": f["file"].replace(str(job), str(traces))} for r, f in whole.items() if r != "7"}


@pytest.mark.parametrize(("option", "said"), [
    (["--workers", "0"], "--workers: got 0; allowed: an integer > 0"),
    (["--scheduler", "tcp://127.0.0.1:1"], "--scheduler tcp://127.0.0.1:1: cannot reach it"),
    (["--scheduler", "nowhere"], "--scheduler: got nowhere; allowed: local, or a Dask scheduler's address"),
])
def test_a_bad_workers_or_scheduler_is_one_line_and_no_run(job: Path, tmp_path: Path, option: list[str],
                                                           said: str) -> None:
    done = glmperf("import", str(job), "--runs-dir", str(tmp_path / "runs"), *option)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(f"glmperf: error: {said}")
    assert "Traceback" not in done.stderr and store.list_runs(tmp_path / "runs") == []


def _dies_on_the_last(job: tuple[int, str]) -> int:
    """A worker's job that kills its process on the last item, once the others are done (each leaves a
    file in the job's folder before it returns, and their results have had time to reach the parent)."""
    item, folder = job
    if item == 3:
        deadline = time.monotonic() + 60
        while len(list(Path(folder).iterdir())) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        os._exit(9)
    (Path(folder) / str(item)).touch()
    return 2 * item


def test_a_worker_that_dies_costs_the_files_not_read_yet_never_those_read(tmp_path: Path) -> None:
    with parallel.pool(workers=2) as where:
        results = dict(where.completed(_dies_on_the_last, [(i, str(tmp_path)) for i in range(4)]))
    assert {i: results[i] for i in (0, 1, 2)} == {0: 0, 1: 2, 2: 4}
    assert isinstance(results[3], parallel.WorkerDied) and "died" in results[3].why
