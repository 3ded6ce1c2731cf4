"""What every command shares, defined once: exit codes, the options several commands take, the one
bad-input error, and how a run argument becomes a run.

A command never prints its own error line: it raises BadInput (or lets ConfigError or StoreError
through), and `glmperf`'s main prints `glmperf: error: <message>` and exits 2. Errors of a command's
own domain (a gate file, a grid, a trace) become BadInput at the command's edge (`bad_input_from`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from optimizers.config import ConfigError
from profiler import store

if TYPE_CHECKING:
    from profiler.analysis import RunData

EXIT_OK, EXIT_FINDING, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
"""0 success; 1 a finding that fails (a failed run, a regression, a plan that does not fit); 2 bad
input, in one line; 130 interrupted (what is done is kept)."""

RUN_HELP = "run directory, run id or run name (the latest of that name)"
SET_METAVAR = "SECTION.KEY=VALUE"


class BadInput(ValueError):
    """Input the command cannot work with; its message is the one line the user sees."""


BAD_INPUT: tuple[type[Exception], ...] = (BadInput, ConfigError, store.StoreError)
"""What a command raises for input it cannot work with (a bad value, a missing or corrupt run)."""


@contextmanager
def bad_input_from(*errors: type[Exception]) -> Iterator[None]:
    """Turn a command's own kinds of input error (GateError, SweepError, ImportFailed) into BadInput."""
    try:
        yield
    except errors as exc:
        raise BadInput(str(exc)) from None


def add_runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", type=Path, help="where runs are (default: $GLMPERF_RUNS or ./runs)")


def add_json(p: argparse.ArgumentParser, help: str | None = None) -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_config(p: argparse._ActionsContainer, help: str | None = None) -> None:
    p.add_argument("--config", type=Path, help=help)


def add_preset(p: argparse._ActionsContainer, help: str | None = None) -> None:
    p.add_argument("--preset", help=help)


def add_set(p: argparse.ArgumentParser, help: str | None = None, *, metavar: str = SET_METAVAR) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar=metavar, help=help)


def add_run(p: argparse.ArgumentParser) -> None:
    """The run a command reads (with --runs-dir to look it up in, and --json)."""
    p.add_argument("run", help=RUN_HELP)
    add_runs_dir(p)
    add_json(p)


def runs_dir(args: argparse.Namespace) -> Path:
    """--runs-dir, else $GLMPERF_RUNS, else ./runs."""
    return store.default_runs_dir(args.runs_dir)


def run_path(args: argparse.Namespace) -> Path:
    """The directory of the run the `run` argument names (a directory, an id or a name)."""
    return store.resolve_run(args.run, runs_dir(args))


def load_run(run_dir: Path) -> RunData:
    """The stored run, refused in one line when it is corrupt."""
    from profiler import analysis

    run = analysis.load_run(run_dir)
    if run.problems:
        raise store.StoreError(f"run {run.id} is corrupt: {'; '.join(run.problems)}")
    return run


def check_steps(option: str, steps: int, profile: Mapping[str, Any]) -> None:
    """Refuse, before any run, steps too few for compare to judge a verification's runs: a run's
    `profile.warmup_steps` and its torch.profiler window (the first repeat is traced) are not counted,
    and a comparison needs `min_steps` steady steps beyond them."""
    from profiler.compare.stats import Options

    wait, warm, active = profile["trace_window"]
    left_out = set(range(profile["warmup_steps"])) | (set(range(wait, wait + warm + active)) if profile["trace"]
                                                      else set())
    least = len(left_out) + Options().min_steps
    if steps < least:
        raise BadInput(f"{option}: got {steps}; allowed: at least {least} (the {len(left_out)} warmup and "
                       f"torch.profiler steps are not counted, and a comparison needs {Options().min_steps} more)")


def status_line(text: str) -> None:
    """One line of long work's progress, on stderr (stdout stays the command's answer)."""
    print(f"  {text} ...", file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    """Print what a command's --json prints: strict JSON (NaN and infinities as null), for any parser."""
    sys.stdout.write(store.json_text(data) + "\n")


def _number(kind: type, allowed: str, ok: Callable[[Any], bool]) -> Callable[[str], Any]:
    """An argparse type: a finite number of `kind` for which `ok` holds. Anything else (NaN, inf, a word,
    out of range) is refused before any work, in glmperf's one line: `--opt: got X; allowed: ...`."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"got {text}; allowed: {allowed}")
        return value

    return parse


finite_float = _number(float, "a finite number", lambda v: True)
positive_float = _number(float, "a finite number > 0", lambda v: v > 0)
non_negative_float = _number(float, "a finite number >= 0", lambda v: v >= 0)
positive_int = _number(int, "an integer > 0", lambda v: v > 0)
"""argparse types of the numbers commands take."""


class Parser(argparse.ArgumentParser):
    """glmperf's parser: a bad argument is BadInput, so it ends as every bad input does (one line, exit 2)
    rather than argparse's usage block and SystemExit."""

    def error(self, message: str) -> NoReturn:
        raise BadInput(message.removeprefix("argument "))
