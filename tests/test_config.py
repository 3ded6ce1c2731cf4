"""Run config: presets, YAML, overrides, and errors that name the key before any work starts."""

from __future__ import annotations

import dataclasses
import json
from functools import reduce
from pathlib import Path
from typing import Any

import pytest

from optimizers import REGISTRY, Candidate, Capability
from optimizers.config import ConfigError
from optimizers.facts import Derived
from profiler.config import RunConfig, load_config
from profiler.settings import shipped_presets


def test_shipped_presets_load() -> None:
    assert {"tiny", "small"} <= set(shipped_presets())
    cfg = load_config(preset="tiny")
    assert cfg.model.preset == "tiny" and cfg.data.seq_len == 64


def test_overrides_use_one_syntax_and_the_primary_field_shorthand() -> None:
    cfg = load_config(preset="tiny", overrides=[
        "switches.amp=bf16", "switches.ddp.bucket_cap_mb=50", "train.steps=7", "model.num_hidden_layers=3",
        "profile.trace_window=[1, 1, 1]", "switches.activation_checkpointing=off", "name=x"])
    assert cfg.switches.amp.dtype == "bf16"
    assert cfg.switches.ddp.bucket_cap_mb == 50.0
    assert cfg.train.steps == 7 and cfg.model.num_hidden_layers == 3 and cfg.model.hidden_size == 64
    assert cfg.profile.trace_window == [1, 1, 1]
    assert cfg.switches.activation_checkpointing.mode == "off"  # YAML's bare off is not False here
    assert cfg.name == "x"


def test_yaml_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: {preset: small}\nswitches:\n  amp: {dtype: fp16, init_scale: 1024}\n")
    cfg = load_config(config=path, overrides=["switches.amp=bf16"])
    assert cfg.model.hidden_size == 256
    assert (cfg.switches.amp.dtype, cfg.switches.amp.init_scale) == ("bf16", 1024.0)


@pytest.mark.parametrize(("overrides", "key", "allowed"), [
    (["model.preset=huge"], "model.preset", "tiny, small"),
    (["model.num_key_value_heads=3"], "model.num_key_value_heads", "divisor"),
    (["train.steps=-1"], "train.steps", "a finite number in [1, 1000000000]"),
    (["data.corpus=/no/such/dir/*.txt"], "data.corpus", "stdlib, synthetic"),
    (["switches.amp=fp8"], "switches.amp.dtype", "off, bf16, fp16"),
    (["switches.nope=1"], "switches.nope", f"allowed: {', '.join(REGISTRY.names())}"),
    (["switches.amp.nope=1"], "switches.amp.nope", "allowed: dtype, init_scale, growth_interval"),
    (["train.steps=true"], "train.steps", "got True; expected int"),  # bool is an int in Python, not here
    (["train.lr=false"], "train.lr", "got False; expected float"),
    (["switches.grad_accumulation=yes"], "switches.grad_accumulation.steps", "got True; expected int"),
    (["train.batch_size=two"], "train.batch_size", "expected int"),
    (["switches.memory_fraction=0.5"], "switches.memory_fraction", "cpu"),
    (["switches.attention=linear", "data.objective=blank_infilling"], "switches.attention", "causal"),
    (["profile.trace_window=[1, 2]"], "profile.trace_window", "wait,warmup,active"),
    (["bogus.key=1"], "bogus.key", "allowed: name, model"),
])
def test_bad_values_fail_naming_the_key_and_what_is_allowed(overrides: list[str], key: str,
                                                            allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(preset="tiny", overrides=overrides)
    assert err.value.key == key
    assert allowed in str(err.value)


def test_unreadable_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(config=tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(config=bad)


def test_every_switch_takes_its_primary_field_shorthand_and_full_keys() -> None:
    """`_set_path` reads the derived SwitchesConfig's type hints: every registered switch resolves."""
    for opt in REGISTRY:
        primary = dataclasses.fields(opt.config)[0]
        default = getattr(opt.config(), primary.name)
        for key in (f"switches.{opt.name}", f"switches.{opt.name}.{primary.name}"):
            cfg = load_config(preset="tiny", overrides=[f"{key}={json.dumps(default)}"])
            assert getattr(cfg.switches, opt.name) == opt.config(), key


def _current(cfg: RunConfig, key: str) -> Any:
    return reduce(getattr, key.split("."), cfg)


CANDIDATES = [pytest.param(opt.name, c, id=f"{opt.name}-{i}") for opt in REGISTRY for i, c in enumerate(opt.candidates)]


@pytest.mark.parametrize(("name", "candidate"), CANDIDATES)
def test_every_candidate_sets_real_keys_to_valid_values(name: str, candidate: Candidate) -> None:
    default = load_config(preset="tiny")
    for key in candidate.set:
        assert not dataclasses.is_dataclass(_current(default, key)), f"{key} is a section, not a value"
    values = candidate.resolve(lambda key: _current(default, key))
    nproc = 2 if Capability.SEVERAL_RANKS in candidate.requires else 1
    cfg = load_config(preset="tiny", overrides=[f"{key}={json.dumps(value)}" for key, value in values.items()],
                      nproc=nproc)
    assert all(_current(cfg, key) == value for key, value in values.items())
    if not candidate.applies(getattr(default.switches, name)):
        return
    if all(_current(default, key) == value for key, value in values.items()):
        # only a value derived from the config or the machine may leave nothing to change (threads beside no
        # loader workers): recommend skips it as what the run does already
        assert any(isinstance(value, Derived) for value in candidate.set.values()), "a no-op candidate"
    else:
        assert cfg != default, "a candidate that applies must change the config"
