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
from typing import Any, ClassVar, cast

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
    metrics_port: int = 0
    """Serve live Prometheus metrics while the job runs on this port (rank r: the port + its local
    rank); 0 serves none. docs/monitoring.md."""
    probe_budget_s: float = 10.0
    """Seconds at the train end to measure the advice's changes on this machine; 0: none. profile-run (one process):
    the reference trainer's probes, cached for `glmperf recommend` (profiler.capture.end_probe); one's own training
    (the Hugging Face and Lightning callbacks): on the model and a batch of the run (profiler.capture.own_probe)."""
    metrics_host: str = "0.0.0.0"
    """The address the metrics are served on: every interface, so that the cluster's Prometheus can
    scrape the job; 127.0.0.1 keeps them on this host."""

    def __post_init__(self) -> None:
        window = self.trace_window
        if len(window) != 3 or not all(isinstance(v, int) and 0 <= v <= 10_000 for v in window) or window[2] < 1:
            raise ConfigError(self.key("trace_window"), f"got {window!r}; allowed: three "
                              "integers wait,warmup,active in [0, 10000] with active >= 1")
        self.trace_window = list(window)
        self.check_range("sample_hz", lo=0.0, hi=1000.0)
        self.check_range("memory_budget_gb", lo=0.0, hi=2.0**20)
        self.check_range("warmup_steps", lo=0, hi=10**9)
        self.check_range("flush_interval_s", lo=0.05, hi=3600.0)
        self.check_range("metrics_port", lo=0, hi=65535)
        self.check_range("probe_budget_s", lo=0.0, hi=3600.0)


RERUN_OVERRIDES = "GLMPERF_OVERRIDES"
"""Environment: the changes a rerun of one's own training asks the framework callback to apply, JSON
{owner: {name: value}} (profiler.experiments.rerun, profiler.integrations)."""
RERUN_RUN_FILE = "GLMPERF_RUN_FILE"
"""Environment: a file the callback appends each run directory it opens to, so a rerun finds its run."""


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value` with a YAML scalar value (`true`, `3`, `[2, 1, 3]`, `bf16`)."""
    if "=" not in text:
        raise ConfigError(text, "expected section.key=value (e.g. switches.amp=bf16)")
    key, raw = text.split("=", 1)
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except YamlRefused:
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


MAX_DEPTH = 64
"""Deepest nesting a YAML config or gate file may have (a config is four levels deep); the parser recurses
once per level, so 20,000 levels would end in a RecursionError."""

MAX_VALUES = 100_000
"""Most values a YAML document may expand to: aliases repeat a node without copying it, and nine levels of
ten aliases (the "billion laughs") expand to 10**9 values when read."""

MAX_FILE_BYTES = 2**20
"""Largest YAML file read (a config is a few hundred bytes; /dev/zero never ends)."""


class YamlRefused(ValueError):
    """YAML that cannot be used: malformed, recursive, too deep or too large; the message is one line."""


class _GuardedLoader(yaml.SafeLoader):
    """SafeLoader that refuses an alias inside its own anchor (a cycle) and nesting past MAX_DEPTH while
    composing, before either can recurse without end."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.composing: list[str] = []
        """The anchor of each node being composed, outermost first ('' for a node without one)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        mark = cast(yaml.Mark, event.start_mark)
        if isinstance(event, yaml.AliasEvent) and event.anchor in self.composing:
            raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} inside the node it names (a cycle)",
                                              mark)
        if len(self.composing) >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
        self.composing.append(getattr(event, "anchor", None) or "")
        try:
            return super().compose_node(parent, index)
        finally:
            self.composing.pop()


def _one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's problem and where it is, on one line: `expected ',' or ']' at line 3, column 8`."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem or exc.context}{where}"
    return " ".join(str(exc).split())


def _count_values(data: Any) -> None:
    """Refuse a document whose aliases expand it past MAX_VALUES (walked without recursion)."""
    stack, seen = [data], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise YamlRefused(f"expands to more than {MAX_VALUES} values (aliases repeated); allowed: fewer")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple, set)):
            stack.extend(node)


def parse_yaml(text: str) -> Any:
    """YAML text as plain data; YamlRefused (one line) for anything malformed, cyclic, too deep or too large."""
    try:
        data = yaml.load(text, Loader=_GuardedLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        raise YamlRefused(_one_line(exc)) from None
    except (ValueError, OverflowError) as exc:  # a scalar its resolver accepts but Python cannot build: 2020-13-45
        raise YamlRefused(" ".join(str(exc).split())) from None
    _count_values(data)
    return data


def load_yaml_file(path: Path, key: str) -> Any:
    """A YAML file (a config, a gate file) as plain data, or ConfigError naming `key` in one line: a file
    that cannot be read, is not UTF-8, or is not YAML we accept (parse_yaml)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(key, f"{path} is larger than {MAX_FILE_BYTES} bytes; allowed: a YAML file up to that")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(key, f"{path} is not UTF-8 text: byte 0x{raw[exc.start]:02x} on line {line}; "
                          "allowed: a UTF-8 YAML file") from None
    try:
        return parse_yaml(text)
    except YamlRefused as exc:
        raise ConfigError(key, f"{path} is not valid YAML: {exc}") from None


def read_yaml(path: Path, key: str = "--config") -> dict[str, Any]:
    """A config file's sections (a YAML mapping), refused in one line naming `key` when it is anything else."""
    data = load_yaml_file(path, key) or {}
    if not isinstance(data, dict):
        raise ConfigError(key, f"{path} must hold a mapping of sections; got a {type(data).__name__}")
    return data


def shipped_presets() -> list[str]:
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))
