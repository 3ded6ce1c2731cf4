"""`glmperf report`: self-contained HTML reports of a run, a comparison or a sweep.

    glmperf report RUN [-o FILE]                  # default: RUN's directory/report.html
    glmperf report --compare BASE CAND [-o FILE]  # or BASE... --vs CAND...; default: ./compare-<base>-vs-<cand>.html
    glmperf report --sweep SWEEP [-o FILE]        # default: the sweep's directory/report.html

Registered on the glmperf command line through the `glmperf.commands` entry point (profiler.plugins);
profile-run calls `after_run` when a run ends, so every run directory gets its report.html. Exit 0
with the path printed; 2 on bad input, in one line (profiler.cli.common), where it is written
included (reports.paths); 130 on Ctrl-C, the old report left as it was. plotly and jinja2 load
only when a report is written, so `glmperf --help` stays quick.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from profiler.cli import common
from reports import paths

REPORT_FILE = "report.html"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `report` on the glmperf command's subparsers."""
    p = subparsers.add_parser(
        "report", help="a self-contained HTML report of a run, a comparison or a sweep",
        description="Write one HTML file that opens with no network: the verdict, then the figures, then the "
                    "tables.",
        epilog="examples: glmperf report RUN; glmperf report --compare BASE CAND -o cmp.html; "
               "glmperf report --sweep SWEEP")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("run", nargs="?", help=common.RUN_HELP)
    what.add_argument("--compare", nargs="+", metavar="BASE", help="baseline run(s); without --vs, exactly BASE "
                      "CAND (a directory of runs stands for all of them)")
    what.add_argument("--sweep", metavar="SWEEP", help="a sweep directory, its sweep.json, or a sweep id")
    p.add_argument("--vs", nargs="+", metavar="CAND", help="candidate run(s) of --compare")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="where to write the report")
    common.add_runs_dir(p)


def write_run_report(run_dir: Path, output: Path | None = None) -> Path:
    """Write the report of the run in `run_dir` (default: run_dir/report.html) and return its path."""
    from reports import html
    from reports.report_run import run_report

    return html.write(output or run_dir / REPORT_FILE, run_report(common.load_run(run_dir)))


Page = Callable[[], str]
"""A report still to render: rendering takes a second, so where it goes is checked first."""


def _run(args: argparse.Namespace, runs_dir: Path) -> tuple[Path, Page]:
    from reports.report_run import run_report

    run_dir = common.run_path(args)
    if args.output is None:
        paths.check_inside(run_dir, runs_dir, "run directory")
    return args.output or run_dir / REPORT_FILE, lambda: run_report(common.load_run(run_dir))


def _compare(args: argparse.Namespace, runs_dir: Path) -> tuple[Path, Page]:
    from profiler.compare.gate import GateError, make_gate
    from profiler.compare.runs import compare
    from profiler.compare.sides import load_sides
    from reports.report_compare import compare_report

    if args.vs is None and len(args.compare) != 2:
        raise common.BadInput("--compare takes BASE CAND, or BASE... --vs CAND...")
    refs = (args.compare[:1], args.compare[1:]) if args.vs is None else (args.compare, args.vs)
    base, cand = load_sides(*refs, runs_dir)
    with common.bad_input_from(GateError):
        result = compare(base, cand, make_gate())
    name = f"compare-{paths.plain_name(result.base[0])}-vs-{paths.plain_name(result.cand[0])}.html"
    return args.output or Path(name), lambda: compare_report(base, cand, result)


def _sweep(args: argparse.Namespace, runs_dir: Path) -> tuple[Path, Page]:
    from reports.report_sweep import read_sweep, sweep_report

    path, sweep = read_sweep(args.sweep, runs_dir)
    if args.output is None:
        paths.check_inside(path.parent, runs_dir, "sweep directory")
    return args.output or path.parent / REPORT_FILE, lambda: sweep_report(sweep, path)


def main(args: argparse.Namespace) -> int:
    """Write the report the arguments ask for and print its path; bad input raises BadInput (exit 2), a
    Ctrl-C says what was left as it was (exit 130)."""
    from reports import html

    runs_dir = common.runs_dir(args)
    if args.vs is not None and args.compare is None:
        raise common.BadInput("--vs goes with --compare")
    make = _compare if args.compare is not None else _sweep if args.sweep is not None else _run
    output: Path | None = None
    try:
        with common.bad_input_from(paths.Refused):
            output, page = make(args, runs_dir)
            paths.check_output(output)
            html.write(output, page())
    except OSError as exc:
        what = f"cannot write {output}" if output is not None else f"cannot read {exc.filename}"
        raise common.BadInput(f"{what}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        print("report interrupted: " + (f"{output} is as it was" if output is not None else "nothing written"),
              file=sys.stderr)
        return common.EXIT_INTERRUPTED
    print(f"report: {output}")
    return common.EXIT_OK


def after_run(run_dir: Path) -> Path | None:
    """profile-run's hook: the finished run's report.html."""
    return write_run_report(run_dir)
