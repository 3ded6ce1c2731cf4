"""The registry of switches, the `switches.*` config derived from it, and `apply_all`, the one
ordered pipeline that turns config into a setup.

Adding a switch is its module (section + apply + `Optimization` record), its name in the import
below and one line in ORDER, its test and its doc row (docs/optimizations.md): `SwitchesConfig`
grows a field by itself. A switch that acts at several places (a parallel layout) adds a `Stage`
line for each further place; stages read their switch's section and are not registered themselves.
The switch modules never import the catalog back (their checks read `optimizers.base.Switches`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from optimizers import (
    activation_checkpointing,
    amp,
    attention,
    checkpointing,
    compile,
    dataloader,
    ddp,
    dynamic_batch,
    ffn_pruning,
    fsdp,
    grad_accumulation,
    init,
    memory_fraction,
    optim,
    parallel,
    param_sharing,
    pipeline,
    stability,
    tensor_parallel,
    threads,
)
from optimizers.base import (
    Optimization,
    Registry,
    SetupContext,
    Stage,
    Switches,
    TrainSetup,
    check_context,
    model_shape,
)

# The pipeline's order, and it matters; the reason stands beside each line. A switch's record is its
# `OPTIMIZATION`; a `STAGE` is a further place where a switch acts (the parallel layout's).
ORDER: tuple[Optimization | Stage, ...] = (
    threads.OPTIMIZATION,  # the thread count first: every later switch's work runs on it
    init.OPTIMIZATION,  # initialize weights first: later switches copy or slice them
    param_sharing.OPTIMIZATION,  # tie blocks before anything counts, prunes or wraps them
    ffn_pruning.OPTIMIZATION,  # shrink/mask FFN weights while the modules are still plain
    attention.OPTIMIZATION,  # choose the kernel before anything traces or wraps the blocks
    parallel.OPTIMIZATION,  # process group and device mesh (pp x dp x fsdp x tp) for the stages below
    pipeline.STAGE,  # cut the blocks into stages first: the other stages work on this rank's part
    tensor_parallel.STAGE,  # split the matmuls before checkpointing and compile wrap the blocks
    activation_checkpointing.OPTIMIZATION,  # wrap blocks before compile sees them (torchtitan)
    compile.OPTIMIZATION,  # compile the final block structure
    memory_fraction.OPTIMIZATION,  # cap CUDA memory before FSDP or DDP allocate
    amp.OPTIMIZATION,  # autocast dtype and GradScaler: FSDP gathers parameters in that dtype
    fsdp.STAGE,  # shard after checkpointing and compile, per block then the root (torchtitan)
    ddp.OPTIMIZATION,  # wrap last: DDP must see the final parameters (not with a sharded layout)
    optim.OPTIMIZER,  # build over the final parameters (after sharing, pruning, sharding)
    optim.LR_SCHEDULE,  # needs the optimizer
    grad_accumulation.OPTIMIZATION,  # micro-batches per step (uses DDP's no_sync if wrapped)
    stability.STABILITY,  # clip / guard settings read by the trainer
    dynamic_batch.OPTIMIZATION,  # batch controller, after everything that changes memory
    dataloader.OPTIMIZATION,  # loader options
    checkpointing.OPTIMIZATION,  # save/resume policy (the trainer does the saving)
)

REGISTRY = Registry()
for _step in ORDER:
    if isinstance(_step, Optimization):
        REGISTRY.register(_step)

# One field per switch, in pipeline order, defaulting to its section's defaults. Derived, not
# written out, so that a new switch is its module and its ORDER line; `__module__` makes it
# picklable and names it where it lives. Its fields exist only once ORDER is read, so to a type
# checker it is the base it derives from (`Switches`: a section read by name).
if TYPE_CHECKING:
    from torch import nn

    SwitchesConfig = Switches
else:
    SwitchesConfig = dataclasses.make_dataclass(
        "SwitchesConfig",
        [(opt.name, opt.config, dataclasses.field(default_factory=opt.config)) for opt in REGISTRY],
        bases=(Switches,),
        namespace={"__module__": __name__, "__doc__": "Every switch of the catalog; defaults are the plain "
                                                         "baseline (AdamW, cosine, clip 1.0)."},
    )

def check_all(switches: SwitchesConfig, ctx: SetupContext) -> None:
    """Refuse, before any work, a switch that cannot run in `ctx` or conflicts with another."""
    check_context(REGISTRY, switches, ctx)


def apply_all(model: nn.Module, switches: SwitchesConfig, ctx: SetupContext) -> TrainSetup:
    """Apply every enabled switch and stage in pipeline order and return what the trainer runs."""
    if ctx.shape is None:
        ctx = dataclasses.replace(ctx, shape=model_shape(model))
    check_all(switches, ctx)
    setup = TrainSetup(model=model)
    for step in ORDER:
        if isinstance(step, Stage):
            section = getattr(switches, step.section)
            if step.enabled(section):
                step.apply(setup, section, ctx)
            continue
        section = getattr(switches, step.name)
        if step.always or step.enabled(section):
            step.apply(setup, section, ctx)
            if step.enabled(section):
                setup.applied.append(step.name)
    return setup
