"""Config sections of the switch catalog, and the small machinery every config section uses.

Each switch has one section here (a dataclass, a docstring per field); `SwitchesConfig` is the
`switches.*` part of a run config. The first field of every section is its *primary* field, so
`switches.amp=bf16` is shorthand for `switches.amp.dtype=bf16`.

Validation happens in `__post_init__` and raises `ConfigError`, whose message names the full key
(`switches.amp.dtype`) and the allowed values, before any work starts. The machinery
(`Section`, `build_section`) is generic so `reference_model` and `profiler` build their own
sections with it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


class ConfigError(ValueError):
    """A config value that is wrong; the message names the key and what is allowed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass
class Section:
    """Base of every config section: knows its key prefix and offers checks that name it."""

    KEY: ClassVar[str] = ""

    def key(self, name: str) -> str:
        return f"{self.KEY}.{name}" if self.KEY else name

    def check_choice(self, name: str, allowed: Iterable[str]) -> None:
        allowed = list(allowed)
        value = getattr(self, name)
        if value not in allowed:
            raise ConfigError(self.key(name), f"got {value!r}; allowed: {', '.join(map(str, allowed))}")

    def check_range(self, name: str, *, lo: float | None = None, hi: float | None = None,
                    lo_open: bool = False, hi_open: bool = False) -> None:
        value = getattr(self, name)
        if value is None:
            return
        bad = (lo is not None and (value <= lo if lo_open else value < lo)) or (
            hi is not None and (value >= hi if hi_open else value > hi))
        if bad:
            left = "(" if lo_open else "["
            right = ")" if hi_open else "]"
            span = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
            raise ConfigError(self.key(name), f"got {value!r}; allowed: a number in {span}")


def _primary_field(cls: type) -> str:
    return dataclasses.fields(cls)[0].name


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Coerce a YAML/CLI scalar to the field's annotated type, or say what was expected."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or (origin is not None and type(None) in args):
        if value is None or value == "none" and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if origin in (list, tuple):
        items = value.split(",") if isinstance(value, str) else list(value)
        return [_coerce(key, v, args[0]) if args else v for v in items]
    try:
        if annotation is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes", "on"):
                    return True
                if value.lower() in ("false", "0", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if annotation is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if annotation is float:
            return float(value)
        if annotation is str:
            if isinstance(value, bool):  # YAML 1.1 reads a bare `off` as False
                return "on" if value else "off"
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(key, f"got {value!r}; expected {getattr(annotation, '__name__', annotation)}") from None
    return value


def build_section(cls: type, data: Any, key: str) -> Any:
    """Build section `cls` from a mapping (or a scalar for its primary field), validating each key."""
    if dataclasses.is_dataclass(data) and isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        data = {_primary_field(cls): data}
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if name not in known:
            raise ConfigError(f"{key}.{name}" if key else name,
                              f"unknown key; allowed: {', '.join(known)}")
        sub_key = f"{key}.{name}" if key else name
        annotation = hints[name]
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            kwargs[name] = build_section(annotation, value, sub_key)
        else:
            kwargs[name] = _coerce(sub_key, value, annotation)
    return cls(**kwargs)


def section_to_dict(obj: Any) -> dict[str, Any]:
    """A section (nested) as plain data, for run.json and YAML."""
    return dataclasses.asdict(obj)


# --------------------------------------------------------------------------------------------
# The catalog's sections, in the order of the catalog table.


@dataclass
class AmpConfig(Section):
    KEY: ClassVar[str] = "switches.amp"
    dtype: str = "off"
    """Autocast dtype: off (fp32), bf16, or fp16 (fp16 always runs with a GradScaler)."""
    init_scale: float = 2.0**16
    """fp16 only: the GradScaler's starting loss scale."""
    growth_interval: int = 2000
    """fp16 only: steps without inf/NaN before the scale doubles."""

    def __post_init__(self) -> None:
        self.check_choice("dtype", ["off", "bf16", "fp16"])
        self.check_range("init_scale", lo=0, lo_open=True)
        self.check_range("growth_interval", lo=1)


@dataclass
class ActivationCheckpointingConfig(Section):
    KEY: ClassVar[str] = "switches.activation_checkpointing"
    mode: str = "off"
    """off; full (every block recomputes its activations in backward); selective (every Nth)."""
    every: int = 2
    """selective only: checkpoint blocks 0, N, 2N, ..."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "full", "selective"])
        self.check_range("every", lo=1)


@dataclass
class GradAccumulationConfig(Section):
    KEY: ClassVar[str] = "switches.grad_accumulation"
    steps: int = 1
    """Micro-batches per optimizer step (each of train.batch_size); 1 = no accumulation."""

    def __post_init__(self) -> None:
        self.check_range("steps", lo=1)


@dataclass
class CompileConfig(Section):
    KEY: ClassVar[str] = "switches.compile"
    mode: str = "off"
    """off, default, or max-autotune (torch.compile modes)."""
    scope: str = "block"
    """block: compile each transformer block (fast to compile, fuses norm/act/epilogues);
    model: compile the whole model."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "default", "max-autotune"])
        self.check_choice("scope", ["block", "model"])


@dataclass
class AttentionConfig(Section):
    KEY: ClassVar[str] = "switches.attention"
    impl: str = "sdpa"
    """eager (matmul + softmax), sdpa (torch's fused kernels), linear (causal elu+1 kernel, O(T))."""

    def __post_init__(self) -> None:
        self.check_choice("impl", ["eager", "sdpa", "linear"])


@dataclass
class ParamSharingConfig(Section):
    KEY: ClassVar[str] = "switches.param_sharing"
    mode: str = "off"
    """off; all (one block's parameters used by every layer, ALBERT); groups (each run of K
    consecutive layers shares one block)."""
    group_size: int = 2
    """groups only: K, the layers per shared block."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "all", "groups"])
        self.check_range("group_size", lo=1)


@dataclass
class FfnPruningConfig(Section):
    KEY: ClassVar[str] = "switches.ffn_pruning"
    mode: str = "off"
    """off; unstructured (magnitude mask, shapes unchanged, kept through training); structured
    (removes whole FFN channels, so the matrices shrink)."""
    sparsity: float = 0.5
    """Share of weights (unstructured) or FFN channels (structured) removed, in [0, 1)."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "unstructured", "structured"])
        self.check_range("sparsity", lo=0.0, hi=1.0, hi_open=True)


@dataclass
class OptimizerConfig(Section):
    KEY: ClassVar[str] = "switches.optimizer"
    name: str = "adamw"
    """adamw, sgd (with momentum), rmsprop, adagrad."""
    impl: str = "auto"
    """auto (torch's default), forloop, foreach (multi-tensor), fused (where torch has it)."""
    weight_decay: float = 0.1
    """Decoupled for adamw; L2 for the others. Not applied to norms and biases."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9
    """sgd and rmsprop only."""

    def __post_init__(self) -> None:
        self.check_choice("name", ["adamw", "sgd", "rmsprop", "adagrad"])
        self.check_choice("impl", ["auto", "forloop", "foreach", "fused"])
        self.check_range("weight_decay", lo=0.0)
        self.check_range("beta1", lo=0.0, hi=1.0, hi_open=True)
        self.check_range("beta2", lo=0.0, hi=1.0, hi_open=True)
        self.check_range("eps", lo=0.0, lo_open=True)
        self.check_range("momentum", lo=0.0, hi=1.0, hi_open=True)


@dataclass
class LrScheduleConfig(Section):
    KEY: ClassVar[str] = "switches.lr_schedule"
    name: str = "cosine"
    """constant, cosine (to min_lr_ratio * lr at the last step), step (x gamma every step_size),
    plateau (x factor when the loss stalls for patience steps)."""
    warmup_steps: int = 10
    """Linear warmup from lr/warmup_steps to lr over the first N optimizer steps (0 = none)."""
    min_lr_ratio: float = 0.1
    step_size: int = 100
    gamma: float = 0.5
    plateau_patience: int = 10
    plateau_factor: float = 0.5

    def __post_init__(self) -> None:
        self.check_choice("name", ["constant", "cosine", "step", "plateau"])
        self.check_range("warmup_steps", lo=0)
        self.check_range("min_lr_ratio", lo=0.0, hi=1.0)
        self.check_range("step_size", lo=1)
        self.check_range("gamma", lo=0.0, hi=1.0, lo_open=True)
        self.check_range("plateau_patience", lo=1)
        self.check_range("plateau_factor", lo=0.0, hi=1.0, lo_open=True, hi_open=True)


@dataclass
class DataLoaderConfig(Section):
    KEY: ClassVar[str] = "switches.dataloader"
    num_workers: int = 0
    """Loader worker processes (0 = load in the training process)."""
    pin_memory: bool = False
    """Page-locked host batches, so host-to-device copies can run async (CUDA only)."""
    prefetch_factor: int = 2
    """Batches each worker keeps ready (workers > 0 only)."""
    persistent_workers: bool = False
    """Keep workers alive across epochs instead of re-forking them."""

    def __post_init__(self) -> None:
        self.check_range("num_workers", lo=0)
        self.check_range("prefetch_factor", lo=1)


@dataclass
class DynamicBatchConfig(Section):
    KEY: ClassVar[str] = "switches.dynamic_batch"
    mode: str = "off"
    """off; latency (shrink the batch when a step exceeds the target, grow it otherwise);
    fit (the largest batch whose measured peak memory fits the budget, found by trying)."""
    target_latency_ms: float = 500.0
    min_batch: int = 1
    max_batch: int = 64
    shrink_step: int = 2
    grow_step: int = 1
    fit_margin: float = 0.1
    """fit only: share of the memory budget kept free as a safety margin."""

    def __post_init__(self) -> None:
        self.check_choice("mode", ["off", "latency", "fit"])
        self.check_range("target_latency_ms", lo=0.0, lo_open=True)
        self.check_range("min_batch", lo=1)
        self.check_range("max_batch", lo=self.min_batch)
        self.check_range("shrink_step", lo=1)
        self.check_range("grow_step", lo=1)
        self.check_range("fit_margin", lo=0.0, hi=1.0, hi_open=True)


@dataclass
class DdpConfig(Section):
    KEY: ClassVar[str] = "switches.ddp"
    comm_hook: str = "none"
    """none (fp32 all-reduce), fp16 or bf16 (compress gradients), powersgd (low-rank)."""
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size; larger buckets mean fewer, bigger all-reduces."""
    powersgd_rank: int = 1
    backend: str = "auto"
    """auto (nccl on CUDA, gloo on CPU), gloo, nccl."""

    def __post_init__(self) -> None:
        self.check_choice("comm_hook", ["none", "fp16", "bf16", "powersgd"])
        self.check_range("bucket_cap_mb", lo=0.0, lo_open=True)
        self.check_range("powersgd_rank", lo=1)
        self.check_choice("backend", ["auto", "gloo", "nccl"])


@dataclass
class StabilityConfig(Section):
    KEY: ClassVar[str] = "switches.stability"
    clip_grad_norm: float = 1.0
    """Clip the global gradient L2 norm to this value (0 = no clipping; the norm is still measured)."""
    nan_guard: str = "skip"
    """off; skip (drop the optimizer step when loss or gradients are NaN/Inf); stop (save a debug
    checkpoint with the batch and stop the run)."""
    spike_factor: float = 3.0
    """A loss above this multiple of the running median is recorded as a spike event."""
    window: int = 20
    """Steps in the running window for spike and plateau detection."""
    plateau_min_delta: float = 1e-4
    """A plateau event fires when the loss improved less than this over the window."""

    def __post_init__(self) -> None:
        self.check_range("clip_grad_norm", lo=0.0)
        self.check_choice("nan_guard", ["off", "skip", "stop"])
        self.check_range("spike_factor", lo=1.0, lo_open=True)
        self.check_range("window", lo=2)
        self.check_range("plateau_min_delta", lo=0.0)


@dataclass
class CheckpointConfig(Section):
    KEY: ClassVar[str] = "switches.checkpoint"
    every: int = 0
    """Save every N optimizer steps (0 = never). Saves are atomic: write, fsync, rename."""
    keep: int = 3
    """Keep the last K checkpoints."""
    dir: str = ""
    """Where to save ('' = <run dir>/checkpoints)."""
    resume: bool = False
    """Continue from the newest good checkpoint in `dir`, exactly where it stopped."""

    def __post_init__(self) -> None:
        self.check_range("every", lo=0)
        self.check_range("keep", lo=1)


@dataclass
class InitConfig(Section):
    KEY: ClassVar[str] = "switches.init"
    scheme: str = "normal"
    """normal (N(0, std), as HF GLM), xavier (Glorot uniform), he (Kaiming normal, fan_in)."""
    std: float = 0.02

    def __post_init__(self) -> None:
        self.check_choice("scheme", ["normal", "xavier", "he"])
        self.check_range("std", lo=0.0, lo_open=True)


@dataclass
class MemoryFractionConfig(Section):
    KEY: ClassVar[str] = "switches.memory_fraction"
    fraction: float = 0.0
    """CUDA per-process memory cap as a share of device memory (0 = no cap)."""

    def __post_init__(self) -> None:
        self.check_range("fraction", lo=0.0, hi=1.0)


@dataclass
class SwitchesConfig(Section):
    """Every switch of the catalog; defaults are the plain baseline (AdamW, cosine, clip 1.0)."""

    KEY: ClassVar[str] = "switches"
    amp: AmpConfig = field(default_factory=AmpConfig)
    activation_checkpointing: ActivationCheckpointingConfig = field(
        default_factory=ActivationCheckpointingConfig)
    grad_accumulation: GradAccumulationConfig = field(default_factory=GradAccumulationConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    param_sharing: ParamSharingConfig = field(default_factory=ParamSharingConfig)
    ffn_pruning: FfnPruningConfig = field(default_factory=FfnPruningConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    lr_schedule: LrScheduleConfig = field(default_factory=LrScheduleConfig)
    dataloader: DataLoaderConfig = field(default_factory=DataLoaderConfig)
    dynamic_batch: DynamicBatchConfig = field(default_factory=DynamicBatchConfig)
    ddp: DdpConfig = field(default_factory=DdpConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    init: InitConfig = field(default_factory=InitConfig)
    memory_fraction: MemoryFractionConfig = field(default_factory=MemoryFractionConfig)
