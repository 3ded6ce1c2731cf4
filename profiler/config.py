"""RunConfig: one section per concern, YAML files plus `--set section.key=value` overrides.

Resolution order: the preset's YAML (configs/<preset>.yaml), then `--config FILE`, then each
`--set` in order. Validation happens while building (each section's `__post_init__`) and then
across sections (`validate`): the corpus exists, the switches can run on this device and world
size. Every error is a `ConfigError` naming the key and what is allowed, raised before a run
directory exists.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from optimizers import SwitchesConfig, check_all
from optimizers.config import ConfigError, Section, build_section, section_to_dict
from reference_model.config import PRESETS, DataConfig, GLMConfig, TrainConfig, resolve_model_section
from reference_model.data import resolve_corpus
from reference_model.trainer import resolve_device, setup_context

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass
class ProfileConfig(Section):
    KEY: ClassVar[str] = "profile"
    trace: bool = True
    """Record a bounded torch.profiler window (chrome trace + operator table)."""
    trace_window: list[int] = field(default_factory=lambda: [2, 1, 3])
    """wait, warmup, active steps of the torch.profiler schedule."""
    sample_hz: float = 5.0
    """Device (NVML) or CPU sampler rate; 0 turns the sampler off. NVML averages utilization over
    1/6 s to 1 s, so faster sampling repeats its figures; 5 Hz costs a tiny step ~0.3% less than 10."""
    memory_budget_gb: float = 0.0
    """The capacity memory diagnosis and dynamic_batch=fit measure against (0 = the device's, or on
    CPU the machine's, memory)."""
    warmup_steps: int = 2
    """Steps excluded from summaries (compile steps always are)."""
    memory_snapshot: bool = False
    """CUDA only: dump an allocator snapshot for pytorch.org/memory_viz."""
    flush_interval_s: float = 2.0
    """How often rows are flushed to disk: a crash loses at most this much."""
    instruments: bool = True
    """False runs the trainer bare (the overhead benchmark's control)."""

    def __post_init__(self) -> None:
        if len(self.trace_window) != 3 or any(int(v) < 0 for v in self.trace_window) \
                or int(self.trace_window[2]) < 1:
            raise ConfigError(self.key("trace_window"), f"got {self.trace_window!r}; allowed: three "
                              "integers wait,warmup,active with active >= 1")
        self.trace_window = [int(v) for v in self.trace_window]
        self.check_range("sample_hz", lo=0.0, hi=1000.0)
        self.check_range("memory_budget_gb", lo=0.0)
        self.check_range("warmup_steps", lo=0)
        self.check_range("flush_interval_s", lo=0.05)


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


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value` with a YAML scalar value (`true`, `3`, `[2, 1, 3]`, `bf16`)."""
    if "=" not in text:
        raise ConfigError(text, "expected section.key=value (e.g. switches.amp=bf16)")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def value_text(value: Any) -> str:
    """A setting's value as a user types it after `--set key=` (what parse_override reads back)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def override_texts(settings: Mapping[str, Any]) -> list[str]:
    """`{"switches.amp.dtype": "bf16"}` -> `["switches.amp.dtype=bf16"]`, as `--set` takes them."""
    return [f"{k}={value_text(v)}" for k, v in settings.items()]


def settings_text(settings: Mapping[str, Any]) -> str:
    """A change of settings on one line, as a user types it: `switches.amp.dtype=bf16 train.lr=0.01`."""
    return " ".join(override_texts(settings))


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("--config", f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("--config", f"{path} must hold a mapping of sections")
    return data


def shipped_presets() -> list[str]:
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))


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
        path = CONFIGS_DIR / f"{preset}.yaml"
        if path.exists():
            merge_into(data, read_yaml(path))
        elif preset in PRESETS:
            _set_path(data, "model.preset", preset)
        else:
            raise ConfigError("--preset", f"got {preset!r}; allowed: {', '.join(shipped_presets())}")
    if config is not None:
        merge_into(data, read_yaml(Path(config)))
    for text in overrides:
        _set_path(data, *parse_override(text))
    cfg = build_run_config(data)
    if check_here:
        validate(cfg, nproc=nproc)
    return cfg


def validate(cfg: RunConfig, *, nproc: int = 1) -> None:
    """Checks that span sections: the corpus exists, the switches can run here."""
    if nproc < 1:
        raise ConfigError("--nproc", f"got {nproc}; allowed: an integer >= 1")
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
