"""The one command mechanism (profiler.cli.main, profiler.cli.common): every command in one table with
the shared options, bad input as one line and exit 2, and a read side that never imports torch."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path

import pytest

from profiler import plugins
from profiler.cli import main, profile_run_main
from profiler.cli.main import COMMANDS, commands, parser
from profiler.cli.profile_run import parser as profile_run_parser
from tests.conftest import ROOT

NO_RUNS_DIR = {"plan": "it plans a config: it reads and writes no runs"}
NO_JSON = {"compare": "--format json", "report": "it writes HTML and prints its path",
           "dashboard": "it serves pages", "init-run": "it prints the run directory, for scripts"}

READ_SIDE = ("import sys\nfrom profiler.cli import main\ntry:\n    code = main(sys.argv[1:])\n"
             "except SystemExit as stop:\n    code = stop.code\n"
             "print('torch loaded' if 'torch' in sys.modules else 'no torch', file=sys.stderr)\nsys.exit(code)")
"""glmperf with its arguments, then whether torch was imported, as the last line of stderr."""


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser(commands())._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def test_every_command_is_in_the_one_table_with_the_shared_options() -> None:
    subcommands = _subcommands()
    assert list(subcommands) == list(commands()) and set(COMMANDS) < set(subcommands)
    assert {"report", "dashboard"} <= set(subcommands)  # the plugins join the same table
    for name, p in subcommands.items():
        assert ("--runs-dir" in _options(p)) == (name not in NO_RUNS_DIR), name
        assert ("--json" in _options(p)) == (name not in NO_JSON), name
    assert {"--runs-dir", "--json", "--config", "--preset", "--set"} <= _options(profile_run_parser())


def test_a_plugin_may_not_take_a_built_in_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins, "commands", lambda: {"runs": types.ModuleType("runs")})
    with pytest.raises(RuntimeError, match="runs"):
        commands()


@pytest.mark.parametrize("args", [
    ["dashboard", "--port", "0"],
    ["recommend", "some-run", "--top", "0"],
    ["tune", "--preset", "tiny", "--steps", "0"],
    ["sweep", "--preset", "tiny", "--grid", "switches.amp=off,bf16", "--steps", "0"],
    ["plan", "--preset", "tiny", "--memory-gb", "0"],
    ["report", "some-run", "--vs", "other-run"],
])
def test_bad_numbers_and_arguments_are_one_line_and_exit_2(args: list[str], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, *([] if args[0] == "plan" else ["--runs-dir", str(tmp_path)])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glmperf: error: ") and "Traceback" not in err[0], err
    assert args[-2] in err[0], err  # it names the option
    assert not any(tmp_path.iterdir())  # refused before any work


def test_profile_run_refuses_bad_steps_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert profile_run_main(["--preset", "tiny", "--steps", "0", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("profile-run: error: train.steps"), err


def test_the_read_side_never_imports_torch(completed_run: Path, two_rank_run: Path, tmp_path: Path) -> None:
    run, runs_dir, other = str(completed_run), str(completed_run.parent), str(two_rank_run)
    for args in (["--help"], ["runs", "--runs-dir", runs_dir], ["show", run], ["show", run, "--json"],
                 ["diagnose", run], ["compare", run, other], ["report", run, "-o", str(tmp_path / "run.html")],
                 ["report", "--compare", run, other, "-o", str(tmp_path / "compare.html")]):
        proc = subprocess.run([sys.executable, "-c", READ_SIDE, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=240)
        assert proc.returncode == 0, (args, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1] == "no torch", args


def test_an_import_and_every_reading_of_it_never_import_torch(tmp_path: Path) -> None:
    """A trace imported (two ranks, a GPU's) and then read every way: the catalog's facts and the diagnosis come
    without torch, which a machine that only reads traces may not even have."""
    runs_dir = str(tmp_path / "runs")
    trace = str(ROOT / "tests" / "data" / "traces_public" / "tracelens_mi300_resnet_rccl")
    for args in (["import", trace, "--name", "mi300"], ["show", "mi300"], ["diagnose", "mi300"],
                 ["recommend", "mi300", "--json"], ["report", "mi300", "-o", str(tmp_path / "run.html")]):
        proc = subprocess.run([sys.executable, "-c", READ_SIDE, *args, "--runs-dir", runs_dir], cwd=ROOT,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, (args, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1] == "no torch", args

