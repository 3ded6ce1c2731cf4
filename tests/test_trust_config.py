"""Configs from outside are read as data, never trusted: a preset is a shipped name, never a path; NaN,
infinities and absurd sizes are refused by name; a YAML file that is not UTF-8, cyclic, too deep, too large
or malformed is one line. Every refusal is exit 2 before any run directory exists, never a traceback."""

from __future__ import annotations

import dataclasses
import os
import random
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from optimizers.config import ConfigError
from profiler.cli import main as glmperf
from profiler.cli import profile_run
from profiler.config import _SECTIONS, load_config
from profiler.settings import CONFIGS_DIR, load_yaml_file, parse_override, shipped_presets


def numeric_keys() -> Iterator[str]:
    """Every int or float setting of every section, as the dotted key `--set` takes."""
    def walk(cls: type, key: str) -> Iterator[str]:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if isinstance(kind, type) and dataclasses.is_dataclass(kind):
                yield from walk(kind, f"{key}.{f.name}")
            elif f.init and {kind, *typing.get_args(kind)} & {int, float}:
                yield f"{key}.{f.name}"
    for name, cls in _SECTIONS.items():
        yield from walk(cls, name)


NUMERIC_KEYS = list(numeric_keys())


def one_line(err: str) -> str:
    """The single error line a refused command prints (asserting there is exactly one)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_numeric_settings_are_all_found() -> None:
    assert {"train.lr", "profile.flush_interval_s", "data.io_delay_ms", "model.num_hidden_layers",
            "switches.optimizer.eps", "switches.parallel.fsdp"} <= set(NUMERIC_KEYS)


# --- presets are names ----------------------------------------------------------------------------------

@pytest.fixture
def outside_config(tmp_path: Path) -> str:
    """A valid config outside configs/, and the `--preset` text that reached it as a relative path."""
    (tmp_path / "outside.yaml").write_text("name: outside\nmodel: {preset: tiny}\n")
    return os.path.relpath(tmp_path / "outside", CONFIGS_DIR)


def test_a_preset_that_is_a_path_reads_nothing(outside_config: str) -> None:
    for preset in (outside_config, "../configs/tiny", "tiny.yaml", "./tiny", str(CONFIGS_DIR / "tiny"), ""):
        with pytest.raises(ConfigError) as err:
            load_config(preset=preset)
        assert err.value.key == "--preset"
        assert f"allowed: one of {', '.join(shipped_presets())}" in str(err.value)
    assert load_config(preset="tiny").name == "tiny"


@pytest.mark.parametrize("command", ["profile-run", "plan"])
def test_the_commands_refuse_a_path_as_a_preset_in_one_line(outside_config: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str], command: str) -> None:
    runs = tmp_path / "runs"
    if command == "profile-run":
        code = profile_run.main(["--preset", outside_config, "--runs-dir", str(runs), "--no-progress"])
    else:
        code = glmperf(["plan", "--preset", outside_config])
    assert code == 2
    assert "--preset: got" in one_line(capsys.readouterr().err)
    assert not runs.exists()


# --- numbers --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", NUMERIC_KEYS)
def test_every_numeric_setting_refuses_nan_infinities_and_absurd_sizes(key: str) -> None:
    for value in ("nan", ".inf", "-.inf", "1.0e300", str(10**30)):
        with pytest.raises(ConfigError) as err:
            load_config(preset="tiny", overrides=[f"{key}={value}"], check_here=False)
        assert err.value.key == key, (value, str(err.value))
        assert ("allowed: " in str(err.value) or "expected int" in str(err.value)) \
            and "\n" not in str(err.value)


def test_the_message_names_the_key_the_value_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(preset="tiny", overrides=["profile.flush_interval_s=nan"])
    assert str(err.value) == "profile.flush_interval_s: got nan; allowed: a finite number in [0.05, 3600]"


def test_profile_run_refuses_a_nan_learning_rate_before_a_run_directory(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    code = profile_run.main(["--preset", "tiny", "--steps", "1", "--set", "train.lr=nan", "--set",
                             "data.corpus=synthetic", "--runs-dir", str(runs), "--no-progress"])
    assert code == 2
    assert one_line(capsys.readouterr().err) == "profile-run: error: train.lr: got nan; allowed: a finite number " \
                                                "in (0, 1e+06]"
    assert not runs.exists()


@pytest.mark.parametrize("args", [
    ["--memory-gb", "nan"], ["--memory-gb", "inf"], ["--memory-gb", "-1"], ["--memory-gb", "1e12"],
    ["--nproc", "0"], ["--nproc", "-3"], ["--nproc", str(10**9)],
    ["--set", f"model.num_hidden_layers={10**9}"], ["--set", f"model.hidden_size={10**12}"],
    ["--set", "model.hidden_size=-64"], ["--set", "model.vocab_size=0"], ["--set", f"train.batch_size={10**12}"],
    ["--set", f"data.seq_len={10**12}"], ["--set", "profile.memory_budget_gb=nan"],
    ["--set", "model.hidden_size=abc"], ["--set", "model.num_hidden_layers=2.5"],
])
def test_plan_refuses_every_bad_number_in_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert glmperf(["plan", "--preset", "tiny", *args]) == 2
    key = args[0] if args[0] != "--set" else args[1].split("=")[0]
    assert one_line(capsys.readouterr().err).startswith(f"glmperf: error: {key}: got ")


# --- YAML files -----------------------------------------------------------------------------------------

BAD_YAML: dict[str, tuple[bytes, str]] = {
    "not UTF-8": (b"train:\n  lr: \xff\xfe\n", "is not UTF-8 text: byte 0xff on line 2"),
    "a cycle": (b"switches: &a {amp: *a}\n", "is not valid YAML: alias *a inside the node it names"),
    "a cycle in a list": (b"a: &a [*a]\n", "is not valid YAML: alias *a inside the node it names"),
    "20000 deep": (b"train: " + b"[" * 20000 + b"]" * 20000 + b"\n", "nested deeper than 64 levels"),
    "malformed": (b"train:\n  lr: [1, 2\n  steps: 3\n",
                  "is not valid YAML: expected ',' or ']', but got ':' at line 3, column 8"),
    "billion laughs": (("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))
        + "data: {corpus: *l9}\n").encode(), "expands to more than 100000 values"),
    "an integer of 5000 digits": (b"train: {steps: " + b"9" * 5000 + b"}\n", "is not valid YAML"),
    "a date that is none": (b"train: {seed: 2020-13-45}\n", "is not valid YAML: month must be in 1..12"),
    "a control character": (b"train: {seed: \x01}\n", "is not valid YAML: unacceptable character"),
    "a list": (b"- train\n", "must hold a mapping of sections; got a list"),
    "larger than a config": (b"#" * (2**20 + 1), "is larger than 1048576 bytes"),
}


@pytest.mark.parametrize("case", BAD_YAML)
def test_a_bad_config_file_is_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, message = BAD_YAML[case]
    path = tmp_path / "c.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as err:
        load_config(config=path)
    assert err.value.key == "--config" and message in str(err.value) and "\n" not in str(err.value)
    assert glmperf(["plan", "--config", str(path)]) == 2
    assert message in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("case", [c for c in BAD_YAML if c != "a list"])
def test_any_yaml_file_such_as_a_gate_file_is_refused_in_one_line_naming_its_option(case: str,
                                                                                   tmp_path: Path) -> None:
    text, message = BAD_YAML[case]
    path = tmp_path / "gate.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as err:
        load_yaml_file(path, "--gate")
    assert err.value.key == "--gate" and message in str(err.value) and "\n" not in str(err.value)
    path.write_text("metrics: {step_time_p50: +5%}\n")
    assert load_yaml_file(path, "--gate") == {"metrics": {"step_time_p50": "+5%"}}


def test_a_config_that_never_ends_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is larger than 1048576 bytes"):
        load_config(config=Path("/dev/zero"))
    with pytest.raises(ConfigError, match=f"cannot read {tmp_path}: Is a directory"):
        load_config(config=tmp_path)


def test_anchors_that_are_not_cycles_still_work(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("switches: {parallel: {fsdp: &one 1, tp: *one}, grad_accumulation: &two {steps: 2}}\n")
    cfg = load_config(config=path)
    assert (cfg.switches.parallel.tp, cfg.switches.grad_accumulation.steps) == (1, 2)


def test_a_set_value_nested_20000_deep_is_a_wrong_type_not_a_recursion_error() -> None:
    key, value = parse_override("train.lr=" + "[" * 20000)
    assert key == "train.lr" and isinstance(value, str)
    with pytest.raises(ConfigError, match="train.lr: got '\\[\\[\\[.*expected float"):
        load_config(preset="tiny", overrides=["train.lr=" + "[" * 20000 + "]" * 20000])


# --- damaged configs, at random -------------------------------------------------------------------------

TINY = (CONFIGS_DIR / "tiny.yaml").read_text()
ODD_NUMBERS: list[Any] = [float("nan"), float("inf"), float("-inf"), -1, 0, 10**30, 1e300, 2**63, -0.5]
ODD_VALUES: list[Any] = [[1, 2], {"a": 1}, "abc", True, None, "", [[[]]]]


def _leaves(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, (*path, k))
    else:
        yield path


def _set(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def damaged(rng: random.Random) -> bytes:
    """The tiny preset damaged one or two ways: truncated, a wrong type, an odd number in a numeric key,
    an unknown key, bytes that are not UTF-8, deep nesting or a cycle."""
    data = yaml.safe_load(TINY)
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["number", "number", "type", "unknown"])
        if kind == "number":
            section, field = rng.choice(NUMERIC_KEYS).split(".", 1)
            data.setdefault(section, {})[field] = rng.choice(ODD_NUMBERS)
        elif kind == "type":
            _set(data, rng.choice(list(_leaves(data))), rng.choice(ODD_VALUES))
        else:
            data.setdefault(rng.choice([*_SECTIONS, "extra"]), {})["bogus"] = 1
    text = yaml.safe_dump(data).encode()
    damage = rng.choice(["none", "truncate", "bytes", "deep", "cycle"])
    if damage == "truncate":
        return text[: rng.randrange(len(text))]
    if damage == "bytes":
        at = rng.randrange(len(text))
        return text[:at] + bytes(rng.choice([0x80, 0xC3, 0xFF, 0xFE])) + text[at:]
    if damage == "deep":
        depth = rng.choice([65, 1000, 20000])
        return text + b"extra: " + b"[" * depth + b"]" * depth + b"\n"
    if damage == "cycle":
        return text + b"extra: &x {a: *x}\n"
    return text


@pytest.mark.parametrize("seed", range(24))
def test_damaged_configs_exit_0_1_or_2_in_one_line_and_make_no_run(seed: int, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """profile-run, plan, sweep and tune read the damaged file; none trains (profile-run and sweep meet a
    bad --nproc or train.steps after the file is read, tune an impossible step count), none makes a run."""
    path, runs = tmp_path / "damaged.yaml", tmp_path / "runs"
    path.write_bytes(damaged(random.Random(seed)))
    commands = [
        lambda: profile_run.main(["--config", str(path), "--nproc", "0", "--runs-dir", str(runs), "--no-progress"]),
        lambda: glmperf(["plan", "--config", str(path)]),
        lambda: glmperf(["sweep", "--config", str(path), "--grid", "switches.amp=off,bf16", "--set",
                         "train.steps=0", "--runs-dir", str(runs), "--no-progress"]),
        lambda: glmperf(["tune", "--config", str(path), "--set", "train.steps=0", "--runs-dir", str(runs),
                         "--no-progress"]),
    ]
    for command in commands:
        code = command()
        err = capsys.readouterr().err
        assert code in (0, 1, 2)
        if code == 2:
            one_line(err)
        assert not runs.exists() or not any(runs.iterdir())
