"""One function mapped over many trace files at once: in worker processes on this machine, or on a Dask cluster.

A job of hundreds of ranks leaves hundreds of traces; read one after another in one process they take
as long as their sum. Here each file is read by one worker at a time, so a worker holds one trace
(memory stays bounded per worker) and as many are read at once as there are workers. Results come back
as each file is done, with its index, so the caller can report progress and still merge in file order. A
worker that dies (killed for its memory) costs the files not read yet (`WorkerDied`), never those read.

Workers on this machine are a ProcessPoolExecutor started by `forkserver`: fork is unsafe in a process
that has started threads (torch's, Dask's), and a forkserver that has imported the trace readers forks
each worker ready, where `spawn` would import them again in every worker. Across machines, Dask: an
existing distributed engine (scheduler, workers, transfers, failures), as Nsight Systems' multi-report
recipes use, instead of one of our own. Dask is optional (glmperf's `dask` extra) and imported only
when a scheduler is asked for.
"""

from __future__ import annotations

import functools
import multiprocessing
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

PRELOAD = ["profiler.traces.summary"]
"""What the forkserver imports once, before it forks the workers."""
LOCAL = "local"
"""The scheduler that is a Dask LocalCluster of `workers` processes on this machine."""
CONNECT_S = 10.0
"""How long to wait for a Dask scheduler's address to answer."""


class SchedulerError(ValueError):
    """The Dask scheduler asked for cannot be used: Dask is not installed, or nothing answers at the address."""


def default_workers(cpus: int | None) -> int:
    """One worker per CPU (at least one); analyze_traces starts no more than there are files, and gives one large
    file's blocks to them all."""
    return max(1, cpus or 1)


@dataclass
class Pool:
    """Where the files are read. `how` is what the run record says: `workers`, and `scheduler`: `processes`
    (this machine's; the calling process itself for one worker), `local` (a Dask LocalCluster) or the address
    of a Dask scheduler (`workers`: the workers it has)."""

    how: dict[str, Any]
    completed: Callable[[Callable[[Any], Any], Sequence[Any]], Iterator[tuple[int, Any]]]
    """(index, fn(item)) for each item as it is done."""


@contextmanager
def pool(workers: int = 1, scheduler: str | None = None) -> Iterator[Pool]:
    """This process for one worker and no scheduler, else `workers` processes, else the Dask `scheduler`
    (`local`: a LocalCluster of `workers` processes; or an address); raises SchedulerError at once where the
    scheduler cannot be used, before any file is read."""
    if scheduler:
        with _client(scheduler, workers) as dask:
            size = workers if scheduler == LOCAL else len(dask.scheduler_info().get("workers", {}))
            yield Pool({"workers": size, "scheduler": scheduler}, functools.partial(_dask_completed, dask))
    elif workers == 1:
        yield Pool({"workers": 1, "scheduler": "processes"}, lambda fn, items: enumerate(map(fn, items)))
    else:
        with processes(workers) as executor:
            yield Pool({"workers": workers, "scheduler": "processes"}, functools.partial(_pool_completed, executor))


@contextmanager
def processes(workers: int, preload: Sequence[str] = PRELOAD) -> Iterator[ProcessPoolExecutor]:
    """`workers` processes forked by the forkserver (module docstring), which imports `preload` first (where this
    process starts it); on leaving, on an error or Ctrl-C too, the work not started is dropped."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    try:
        yield executor
    finally:
        executor.shutdown(cancel_futures=True)


@dataclass
class WorkerDied:
    """The result of an item whose worker process died (killed for memory, a signal): the items done stay."""

    why: str


def _pool_completed(executor: ProcessPoolExecutor, fn: Callable[[Any], Any],
                    items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    futures = {executor.submit(fn, item): i for i, item in enumerate(items)}
    for future in as_completed(futures):
        try:
            yield futures[future], future.result()
        except BrokenProcessPool as exc:  # every item not done yet fails with it: which one killed it is unknown
            yield futures[future], WorkerDied(f"a worker process died while it was being read ({exc})")


def _dask_completed(dask: Any, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    from dask.distributed import KilledWorker
    from dask.distributed import as_completed as dask_completed

    futures = dask.map(fn, items, pure=False)
    index = {future.key: i for i, future in enumerate(futures)}
    for future in dask_completed(futures):
        try:
            yield index[future.key], future.result()
        except KilledWorker as exc:  # Dask retried it on other workers first
            yield index[future.key], WorkerDied(f"the Dask workers reading it died ({exc})")


@contextmanager
def _client(scheduler: str, workers: int) -> Iterator[Any]:
    """A Dask client of the scheduler at `scheduler`, or of a LocalCluster of `workers` processes (one thread
    each) for `local`; closed (and the cluster stopped) on leaving."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise SchedulerError(f"--scheduler {scheduler}: Dask is not installed; install it with "
                             "pip install 'dask[distributed]>=2024.1' (glmperf's `dask` extra)") from None
    if scheduler == LOCAL:
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as dask:
            yield dask
        return
    _check_address(scheduler)
    try:
        dask = Client(scheduler, timeout=CONNECT_S)
    except (OSError, ValueError, TypeError) as exc:
        raise SchedulerError(f"--scheduler {scheduler}: no Dask scheduler there ({exc}); allowed: {LOCAL} or "
                             "the address of a running one (tcp://HOST:PORT)") from None
    with dask:
        yield dask


def _check_address(address: str) -> None:
    """Refuse at once a tcp:// (or tls://) address where nothing listens, rather than wait out Dask's retries."""
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    if scheme not in ("", "tcp", "tls") or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=CONNECT_S).close()
    except OSError as exc:
        raise SchedulerError(f"--scheduler {address}: cannot reach it ({exc.strerror or exc}); allowed: "
                             f"{LOCAL} or the address of a running Dask scheduler (tcp://HOST:PORT)") from None
