"""The parts of a run's config that need no model code: the profile section, `--set` texts and the
shipped presets' files.

They are read by commands that only look at stored runs (`glmperf show`, `compare`, `report`), which
must start without importing torch; building a whole RunConfig (profiler.config) needs the switch
catalog and the model code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from optimizers.config import ConfigError, Section


def _configs_dir() -> Path:
    """The shipped presets: inside the package when installed from a wheel (pyproject maps configs/ to
    profiler/presets), else the checkout's top-level configs/."""
    here = Path(__file__).resolve().parent
    packaged = here / "presets"
    return packaged if packaged.is_dir() else here.parent / "configs"


CONFIGS_DIR = _configs_dir()


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
