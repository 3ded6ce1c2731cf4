"""A real `glmperf dashboard` server for the tests that reach it over HTTP (a browser, a socket)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import ROOT

CLI = "import sys; from profiler.cli import main; sys.exit(main())"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(runs_dir: Path, log: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`glmperf dashboard --runs-dir runs_dir ARGS` on a free port, once it answers on 127.0.0.1; its output
    goes to `log`, shown should it end before it answers."""
    port = free_port()
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-c", CLI, "dashboard", "--runs-dir", str(runs_dir),
                                   "--port", str(port), *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, log.read_text()
                time.sleep(0.5)
        yield server, port
    finally:
        server.terminate()
        server.wait(timeout=30)
