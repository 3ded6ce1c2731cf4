"""The pieces every switch shares: the context it runs in, the setup it edits, its facts, the registry.

A switch is one module holding its config section (a `Section` dataclass), one
`apply_<switch>(setup, cfg, ctx)` that edits a `TrainSetup` (the wrapped model, optimizer, autocast,
scaler, ... the trainer runs) and an `Optimization` record with its facts: the bottlenecks it
addresses and its candidate changes (optimizers.vocabulary, optimizers.facts) besides the prose.
The model protocol a switch may rely on is small (see `blocks`), so the catalog works on a user's
own model too.

The catalog's facts load without torch (commands that only read stored runs start without it): the switch
modules import torch inside the functions that build or run a setup, and name its types for checkers only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast, overload

from optimizers.config import ConfigError, Section
from optimizers.facts import Candidate
from optimizers.vocabulary import Bottleneck, Capability

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger("glmperf.optimizers")


@dataclass(frozen=True)
class ModelShape:
    """The sizes layout checks divide by (heads, layers, widths), read off the model protocol."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    intermediate_size: int


def _cpu() -> torch.device:
    import torch

    return torch.device("cpu")


def model_shape(model: nn.Module) -> ModelShape | None:
    """The shape of a model that follows the protocol (`blocks`): its first block's sizes; None when
    its blocks do not say their head counts and widths."""
    layers = blocks(model)
    first = layers[0]
    attn: Any = getattr(first, "self_attn", None)  # a user's model: whatever its blocks hold
    mlp: Any = getattr(first, "mlp", None)
    if not all(hasattr(attn, a) for a in ("num_heads", "num_key_value_heads")) or not hasattr(mlp, "down_proj"):
        return None
    down: nn.Linear = mlp.down_proj
    return ModelShape(num_layers=len(layers), num_heads=attn.num_heads, num_kv_heads=attn.num_key_value_heads,
                      hidden_size=down.out_features, intermediate_size=down.in_features)


@dataclass(kw_only=True)
class SetupContext:
    """Where the setup will run; switches that cannot run there refuse at config time.

    Every run figure is required: the context is built from a run's config (our trainer's
    `reference_model.context.setup_context`), so there is no second set of defaults to disagree.
    """

    total_steps: int
    """Optimizer steps of the run (schedules need the horizon)."""
    lr: float
    batch_size: int
    """Micro-batch size in samples, the one the loader starts with."""
    seq_len: int
    """Tokens per sample (memory-fitting switches build trial batches of this shape)."""
    objective: str
    """causal or blank_infilling (linear attention can run only the first)."""
    device: torch.device = field(default_factory=_cpu)
    world_size: int = 1
    rank: int = 0
    memory_budget_bytes: int | None = None
    """The capacity memory-fitting switches aim under (None: the device's or machine's)."""
    wrap_comm_hook: Callable[..., Any] | None = None
    """`wrap_comm_hook(torch_hook, wire_dtype) -> hook`: the profiler's communication recorder,
    registered by DDP in place of torch's hook (None: torch's hook as it is)."""
    shape: ModelShape | None = None
    """The model's sizes, for checks that divide them (parallel layouts); None: read off the model
    when `apply_all` gets it."""


class BatchController(Protocol):
    """Decides the next micro-batch size from the last step (dynamic batching)."""

    batch_size: int

    def observe(self, step_time_s: float, peak_memory_bytes: int | None) -> int: ...


class StepMonitor(Protocol):
    """Watches per-step figures and returns events (dicts) worth recording, e.g. a loss spike."""

    def observe(self, step: int, loss: float, grad_norm: float) -> list[dict[str, Any]]: ...


class Pipeline(Protocol):
    """A pipeline schedule as the trainer and the later stages see it (optimizers.pipeline_schedule.PipelineRunner)."""

    @property
    def modules(self) -> Sequence[nn.Module]:
        """The chunks of blocks the schedule calls (FSDP shards each as a root)."""
        ...

    @property
    def chunk_blocks(self) -> list[nn.ModuleList]:
        """Each chunk's blocks, in order (sequence parallelism wraps the first and last of each)."""
        ...

    blocks: list[int]
    """The model's numbers of the blocks this rank keeps."""

    def __call__(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Forward and backward of a batch; the batch's mean loss on every stage."""
        ...


@dataclass
class TrainSetup:
    """Everything the trainer needs to run a step; switches edit it in `apply_all` order."""

    model: nn.Module
    """What the trainer calls: maybe compiled or DDP-wrapped."""
    raw_model: nn.Module = field(init=False)
    """The plain model (state dicts, parameter counts): `model` as the setup starts, before any wrapping."""
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    """A torch LR scheduler; `step_scheduler` knows whether it wants the loss (plateau)."""
    scheduler_wants_loss: bool = False
    autocast_dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    accumulation_steps: int = 1
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None
    """DDP's `no_sync`, used on every micro-batch but the last of an accumulation."""
    clip_grad_norm: float = 0.0
    nan_guard: str = "off"
    monitors: list[StepMonitor] = field(default_factory=list)
    post_step_hooks: list[Callable[[], None]] = field(default_factory=list)
    """Run after every optimizer step (e.g. re-apply pruning masks)."""
    batch_controller: BatchController | None = None
    loader_options: dict[str, Any] = field(default_factory=dict)
    """DataLoader keyword arguments chosen by the dataloader switch."""
    compiled: bool = False
    """True when torch.compile is on: the first steps include compile time."""
    mesh: Any = None
    """The device mesh of a sharded or model-parallel layout (a torch DeviceMesh with dims pp, dp,
    fsdp, tp); None for one process or plain data parallel (DDP)."""
    pipeline: Pipeline | None = None
    """Runs forward and backward of a batch through a pipeline schedule (the trainer calls it instead
    of the model)."""
    grad_norm_group: Any = None
    """The process group over which the gradient norm is completed (pipeline stages each hold
    their own blocks' gradients); None: this rank's gradients are the whole model's."""
    data_shard: tuple[int, int] | None = None
    """(index, count) of the data-parallel replica this rank belongs to, for the loader: ranks of
    one tensor-parallel group read the same batch. None: every rank is its own replica."""
    applied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.raw_model = self.model

    def note(self, switch: str, message: str) -> None:
        """Record (and log) what a switch did, for the run record and the console."""
        self.notes.append(f"{switch}: {message}")
        log.info("%s: %s", switch, message)

    def step_scheduler(self, loss: float | None) -> None:
        if self.scheduler is None:
            return
        if self.scheduler_wants_loss:
            self.scheduler.step(loss)
        else:
            self.scheduler.step()

    @contextlib.contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """Skip DDP's all-reduce on every micro-batch but the last (no_sync)."""
        if self.no_sync is not None and not last:
            with self.no_sync():
                yield
        else:
            yield


class SelfAttention(Protocol):
    """What the switches set of a block's `self_attn`."""

    attention_fn: Callable[..., torch.Tensor]
    """`fn(q, k, v, *, mask, scale) -> Tensor` (optimizers.attention_kernels.AttentionFn), replaced by the
    attention switch."""


class FeedForward(Protocol):
    """What the switches read and replace of a block's `mlp`: a SwiGLU, its gate rows first in `gate_up_proj`."""

    gate_up_proj: nn.Linear
    down_proj: nn.Linear

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


if TYPE_CHECKING:
    # Typing only: a block is an nn.Module *and* has these two attributes, which a checker can only be told
    # as a subclass; no model derives from it. `blocks` returns its list typed so.
    class Block(nn.Module):
        self_attn: SelfAttention
        mlp: FeedForward

    class BlockList(nn.ModuleList):
        def __iter__(self) -> Iterator[Block]: ...
        @overload
        def __getitem__(self, idx: slice) -> BlockList: ...
        @overload
        def __getitem__(self, idx: int) -> Block: ...
        def __getitem__(self, idx: int | slice) -> Block | BlockList: ...


def blocks(model: nn.Module) -> BlockList:
    """The model protocol: `model.blocks` is the list of transformer blocks, in order.

    Each block has `self_attn` (with an `attention_fn` attribute the attention switch replaces,
    `num_heads` and `num_key_value_heads`, and `q_proj`, `k_proj`, `v_proj`, `o_proj` Linears)
    and `mlp` (with `gate_up_proj` and `down_proj` Linears, gate first). Blocks may be replaced
    in the list (parameter sharing) or have their `forward` wrapped (checkpointing). What the switches
    touch of a block by name is typed by `SelfAttention` and `FeedForward`; the head counts are optional
    (`model_shape` is None without them).
    """
    from torch import nn

    found = getattr(model, "blocks", None)
    if not isinstance(found, nn.ModuleList):
        raise TypeError(
            f"{type(model).__name__} does not follow the optimizers model protocol: it needs a "
            "`blocks` nn.ModuleList of transformer blocks (see optimizers.base.blocks)")
    return cast("BlockList", found)


class Switches(Section):
    """The `switches.*` config as a check reads it: one section per switch, by the switch's name.

    `optimizers.catalog.SwitchesConfig` derives from it, one field per registered switch; a switch's
    module sits below the catalog, so its checks name this base rather than import the catalog back.
    """

    KEY: ClassVar[str] = "switches"

    if TYPE_CHECKING:  # the fields are derived from the registry at import time, out of a checker's sight
        def __getattr__(self, name: str) -> Any: ...


Check = Callable[[Switches, SetupContext], "str | None"]
"""Returns the reason a configuration cannot run in this context, or None."""


@dataclass(frozen=True)
class Stage:
    """A further place in the pipeline where a switch acts on the setup, under its own section.

    One switch may need several places: a parallel layout builds its mesh early, splits tensors
    before checkpointing and compile wrap the blocks, and shards parameters after them. The switch's
    `Optimization` record holds its facts and checks; a stage is only an `apply` at its position.
    """

    name: str
    """Says what the stage does, in notes and errors (e.g. 'fsdp')."""
    section: str
    """The switch whose config section the stage reads (`switches.<section>`)."""
    apply: Callable[[TrainSetup, Any, SetupContext], None]
    enabled: Callable[[Any], bool]


@dataclass(frozen=True)
class Optimization:
    """One switch of the catalog and the facts `recommend` ranks it by."""

    name: str
    """The `switches.<name>` key."""
    config: type[Section]
    """Its config section, defined in the switch's module; `SwitchesConfig` has one field of it."""
    apply: Callable[[TrainSetup, Any, SetupContext], None]
    enabled: Callable[[Any], bool]
    """Whether the section asks for anything beyond the baseline."""
    addresses: tuple[Bottleneck, ...]
    """The bottleneck kinds this switch relieves."""
    effect: str
    cost: str
    risk: str
    source: str
    """Where the source documents discuss it (e.g. '000 2.3')."""
    needs: str = ""
    checks: tuple[Check, ...] = ()
    """Context checks run at config time (conflicts, missing hardware)."""
    candidates: tuple[Candidate, ...] = ()
    """The concrete changes a recommender may propose, with their expected effects (optimizers.facts)."""
    always: bool = False
    """Applied even at its defaults, because the baseline needs it: the baseline trains with AdamW,
    a cosine schedule and clipping at 1.0, and DDP wraps the model whenever there are several ranks
    (in one process it does nothing)."""


class Registry:
    """Switches by name, in the order `apply_all` applies them; refuses duplicates and unknowns."""

    def __init__(self) -> None:
        self._items: dict[str, Optimization] = {}

    def register(self, opt: Optimization) -> None:
        """Add `opt`, refusing a second switch of that name and facts outside the vocabularies."""
        if opt.name in self._items:
            raise ValueError(f"switch {opt.name!r} is registered twice")
        key = f"switches.{opt.name}"
        if not (isinstance(opt.config, type) and issubclass(opt.config, Section) and key == opt.config.KEY):
            raise ValueError(f"switch {opt.name!r} has no section: its config must be a Section with KEY {key!r}")
        _check_vocabulary(opt.name, "addresses", opt.addresses, Bottleneck)
        for candidate in opt.candidates:
            _check_vocabulary(opt.name, "requires", candidate.requires, Capability)
        self._items[opt.name] = opt

    def get(self, name: str) -> Optimization:
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(f"switches.{name}", f"unknown switch; known: {', '.join(self._items)}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __iter__(self) -> Iterator[Optimization]:
        return iter(self._items.values())


def _check_vocabulary(switch: str, what: str, names: tuple[str, ...],
                      vocabulary: type[Bottleneck] | type[Capability]) -> None:
    """Refuse a name outside `vocabulary`, naming the switch, the bad name and the known ones."""
    known = {member.value for member in vocabulary}
    for name in names:
        if name not in known:
            raise ValueError(f"switch {switch!r} {what} {name!r}, not a known {vocabulary.__name__}; "
                             f"known: {', '.join(sorted(known))}")


def check_context(registry: Registry, switches: Switches, ctx: SetupContext) -> None:
    """Raise `ConfigError` for the first switch that cannot run here or conflicts with another."""
    for opt in registry:
        for check in opt.checks:
            reason = check(switches, ctx)
            if reason:
                raise ConfigError(f"switches.{opt.name}", reason)
