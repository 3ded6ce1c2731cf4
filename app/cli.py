"""`glmperf dashboard`: the Streamlit dashboard over a runs directory.

    glmperf dashboard [--runs-dir DIR] [--port P] [--host ADDRESS]

It has no login: it serves on 127.0.0.1 unless --host opens it to a network, which it warns about.
Registered on the glmperf command line through the `glmperf.commands` entry point (profiler.plugins).
It runs `streamlit run app/streamlit_app.py` in place of this process (so Ctrl-C and a kill reach the
server itself), with the runs directory in $GLMPERF_RUNS, where every page reads it. Streamlit loads
only then, so `glmperf --help` stays quick.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from profiler.cli import common

APP = Path(__file__).resolve().parent / "streamlit_app.py"
DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `dashboard` on the glmperf command's subparsers."""
    p = subparsers.add_parser(
        "dashboard", help="browse, compare and act on stored runs in a browser (Streamlit)",
        description="Serve the dashboard: every run with its figures and verdict, comparisons, recommendations "
                    "and their verification. It reads the runs directory as it changes, so a running run "
                    "updates while it runs.",
        epilog="example: glmperf dashboard --runs-dir runs --port 8501, then open http://localhost:8501")
    common.add_runs_dir(p)
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port to serve on (default {DEFAULT_PORT})")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"the address to serve on (default {DEFAULT_HOST}: this machine only). The dashboard has no "
                        "login: another address lets anyone who reaches it read the runs and start runs "
                        "(docs/dashboard.md: an SSH tunnel or a reverse proxy with a login instead)")


def command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The streamlit command line and its environment (the runs directory made absolute)."""
    if not 0 < args.port < 65536:
        raise common.BadInput(f"--port: got {args.port}; allowed: 1 to 65535")
    runs_dir = common.runs_dir(args).resolve()
    if runs_dir.exists() and not runs_dir.is_dir():
        raise common.BadInput(f"runs directory {runs_dir} is a file, not a directory")
    argv = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", args.host,
            "--server.port", str(args.port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    return argv, {**os.environ, "GLMPERF_RUNS": str(runs_dir)}


def main(args: argparse.Namespace) -> int:
    """Replace this process with the Streamlit server; bad input raises BadInput (exit 2)."""
    argv, env = command(args)
    if args.host not in LOOPBACK:
        print(f"dashboard: serving on {args.host} with no login: anyone who can reach this port can read the runs "
              "and start runs", file=sys.stderr, flush=True)
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address in a URL
    print(f"dashboard: http://{host}:{args.port} (runs: {env['GLMPERF_RUNS']})", flush=True)
    os.execve(argv[0], argv, env)
