"""RunConfig: one section per concern, YAML files plus `--set section.key=value` overrides.

Resolution order: the preset's YAML (configs/<preset>.yaml), then `--config FILE`, then each
`--set` in order. Validation happens while building (each section's `__post_init__`) and then
across sections (`validate`): the corpus exists, the switches can run on this device and world
size. Every error is a `ConfigError` naming the key and what is allowed, raised before a run
directory exists.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizers import SwitchesConfig, check_all
from optimizers.config import ConfigError, build_section, check_number, section_to_dict
from optimizers.parallel import MAX_RANKS
from profiler.metrics import flatten, lookup
from profiler.settings import CONFIGS_DIR, ProfileConfig, parse_override, read_yaml, shipped_presets
from reference_model.config import PRESETS, DataConfig, GLMConfig, TrainConfig, resolve_model_section
from reference_model.context import resolve_device, setup_context
from reference_model.corpus import resolve_corpus


@dataclass
class RunConfig:
    """A whole run: what to train (model, data, train, switches) and how to measure it (profile)."""

    name: str = "run"
    model: GLMConfig = field(default_factory=GLMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    switches: SwitchesConfig = field(default_factory=SwitchesConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)

    def to_dict(self) -> dict[str, Any]:
        return section_to_dict(self)

    @property
    def memory_budget_bytes(self) -> int | None:
        return int(self.profile.memory_budget_gb * 2**30) or None


_SECTIONS = {"model": GLMConfig, "data": DataConfig, "train": TrainConfig, "switches": SwitchesConfig,
             "profile": ProfileConfig}


def _set_path(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c = value` in nested dicts, schema-aware: a scalar on a section sets its primary field."""
    parts = key.split(".")
    if parts[0] == "name" and len(parts) == 1:
        data["name"] = str(value)
        return
    if parts[0] not in _SECTIONS:
        raise ConfigError(key, f"unknown section; allowed: name, {', '.join(_SECTIONS)}")
    cls: Any = _SECTIONS[parts[0]]
    node = data.setdefault(parts[0], {})
    if parts[0] == "model":  # model.preset and model.<field>: flat
        if len(parts) != 2:
            raise ConfigError(key, "allowed: model.preset or model.<field>")
        node[parts[1]] = value
        return
    for i, name in enumerate(parts[1:], start=1):
        hints = typing.get_type_hints(cls)
        if name not in hints or name == "KEY":
            allowed = [f.name for f in dataclasses.fields(cls)]
            raise ConfigError(".".join(parts[: i + 1]), f"unknown key; allowed: {', '.join(allowed)}")
        sub = hints[name]
        last = i == len(parts) - 1
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            if not isinstance(node.get(name), dict):
                node[name] = {} if node.get(name) is None else {dataclasses.fields(sub)[0].name: node[name]}
            if last:
                if isinstance(value, dict):
                    node[name].update(value)
                else:
                    node[name][dataclasses.fields(sub)[0].name] = value
                return
            node, cls = node[name], sub
        else:
            if not last:
                raise ConfigError(".".join(parts[: i + 1]), "is a value, not a section")
            node[name] = value
            return


def merge_into(data: dict[str, Any], extra: dict[str, Any], prefix: str = "") -> None:
    """Apply a YAML mapping as if each leaf were a `--set` (same checks, same shorthand)."""
    for key, value in extra.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            merge_into(data, value, path)
        else:
            _set_path(data, path, value)


def build_run_config(data: dict[str, Any]) -> RunConfig:
    """Build and validate every section from plain data (YAML-shaped)."""
    unknown = set(data) - set(_SECTIONS) - {"name"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], f"unknown section; allowed: name, {', '.join(_SECTIONS)}")
    return RunConfig(
        name=str(data.get("name", "run")),
        model=resolve_model_section(data.get("model")),
        data=build_section(DataConfig, data.get("data"), "data"),
        train=build_section(TrainConfig, data.get("train"), "train"),
        switches=build_section(SwitchesConfig, data.get("switches"), "switches"),
        profile=build_section(ProfileConfig, data.get("profile"), "profile"),
    )


def load_config(*, config: Path | None = None, preset: str | None = None,
                overrides: typing.Sequence[str] = (), nproc: int = 1,
                base: dict[str, Any] | None = None, check_here: bool = True) -> RunConfig:
    """Resolve base -> preset -> file -> overrides into a validated RunConfig (no side effects).

    `base` is a resolved config as plain data (a stored run's `config`), to start from that run.
    `check_here=False` skips the checks that this machine can run the config (its device, corpus and
    toolchain), for commands that only reason about a run meant for elsewhere (`glmperf plan`).
    """
    data: dict[str, Any] = {}
    if base is not None:
        merge_into(data, base)
    if preset is not None:
        merge_into(data, preset_data(preset))
    if config is not None:
        merge_into(data, read_yaml(Path(config)))
    for text in overrides:
        _set_path(data, *parse_override(text))
    cfg = build_run_config(data)
    if check_here:
        validate(cfg, nproc=nproc)
    return cfg


def preset_data(preset: str) -> dict[str, Any]:
    """A preset's settings: its shipped file (configs/<name>.yaml), else a bare model preset.

    A preset is a name, never a path: only the names listed are looked up, so `--preset ../../x` reads
    nothing (`--config FILE` is how to read any file)."""
    shipped = shipped_presets()
    if preset in shipped:
        return read_yaml(CONFIGS_DIR / f"{preset}.yaml", "--preset")
    if preset in PRESETS:
        return {"model": {"preset": preset}}
    allowed = sorted({*shipped, *PRESETS})
    raise ConfigError("--preset", f"got {preset!r}; allowed: one of {', '.join(allowed)} (or --config FILE)")


def validate(cfg: RunConfig, *, nproc: int = 1) -> None:
    """Checks that span sections: the corpus exists, the switches can run here."""
    check_number("--nproc", nproc, lo=1, hi=MAX_RANKS)
    resolve_corpus(cfg.data.corpus)
    try:
        device = resolve_device(cfg.train.device)
    except RuntimeError as exc:
        raise ConfigError("train.device", str(exc)) from None
    if device.type == "cuda" and not __import__("torch").cuda.is_available():
        raise ConfigError("train.device", f"got {cfg.train.device!r} but CUDA is not available; allowed: cpu, auto")
    ctx = setup_context(cfg.train, cfg.data, device=device, rank=0, world_size=nproc,
                        memory_budget_bytes=cfg.memory_budget_bytes, model=cfg.model)
    check_all(cfg.switches, ctx)


@functools.cache
def _preset_flat(preset: Any, world_size: int) -> dict[str, Any]:
    """A preset's resolved config as run.json stores it, flattened (once per preset)."""
    return flatten(json.loads(json.dumps(load_config(preset=preset, nproc=world_size).to_dict(), default=str)))


def preset_changes(config: Mapping[str, Any], world_size: int) -> list[str]:
    """The keys of a stored config whose values differ from its preset's, as `key=value` a user would type;
    ConfigError when the preset is not known."""
    ref, ours = _preset_flat(lookup(config, "model.preset"), world_size), flatten(config)
    return [f"{k}={ours[k]}" for k in sorted(ours) if k != "name" and ref.get(k) != ours[k]]
