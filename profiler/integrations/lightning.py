"""glmperf for Lightning: `L.Trainer(..., callbacks=[GlmperfCallback(name=..., runs_dir=...)])`.

Takes api.run's keywords (profiler.api.OPTIONS; `config` defaults to the LightningModule's
hyperparameters, `model` to the module, `name` to its class name, `amp` to the Trainer's precision)
and `tokens_of`, a function of a batch giving its input tokens (default: the batch's `input_ids`,
else its first tensor). Importing this module imports nothing of Lightning; the callback class is
built on first use, with one clear error naming the `lightning` extra when Lightning is missing.

What it measures, from Lightning's hooks (automatic optimization):

- a step is one optimizer step: from `on_train_batch_start` of its first batch to
  `on_train_batch_end` of its last (`accumulate_grad_batches` batches);
- `forward`: batch start to `on_before_backward` (training_step, the loss, zero_grad); `backward`:
  `on_before_backward` to `on_after_backward`; `optimizer`: `on_before_optimizer_step` to the batch
  end (the optimizer step, zero_grad, the scheduler when it steps per batch);
- tokens: `tokens_of(batch)` per batch; the loss: training_step's `loss`, averaged over the batches;
- the data wait is not measured: Lightning fetches the next batch before `on_train_batch_start`;
- DDP: each rank writes its part of one run; Lightning's own ranks and world size are used, and
  the DDP model's gradient all-reduces are counted unless a comm hook of its own is registered.

Under `glmperf recommend RUN --verify -- COMMAND` (profiler.experiments.rerun), importing the callback
has every Trainer built afterwards take the arguments the rerun asks for (precision,
accumulate_grad_batches).

Given `probe_loss` (a function of the module and a batch returning its loss, e.g. `lambda m, b:
m.training_step(b, 0)` where training_step has no side effects: no counters, no metrics' state, no
`self.log`), the callback measures the advice's autocast change on the module and the first training
batch at the train end (profiler.capture.own_probe; `profile={"probe_budget_s": 0}` turns it off).
Without it nothing is probed: a training_step called outside the loop could change what the module
counts or logs.

The run records the Trainer's precision, accumulate_grad_batches and strategy, whether the module
was compiled, its optimizer (class, fused) and the train DataLoader's num_workers, pin_memory and
batch_size (run.json config.framework), which the advice checks its changes against
(profiler.advice.framework). The run ends at `on_train_end`, or at `on_exception` (`failed` with the
error, `interrupted` on Ctrl-C), with every step measured before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from profiler.integrations.common import CallbackRun, TokensOf, batch_tokens, overrides, require, take_overrides


def _build() -> type:
    pl = require("lightning.pytorch", extra="lightning", what="profiler.integrations.lightning.GlmperfCallback")
    base: Any = pl.Callback  # known once the framework is imported
    take_overrides(pl.Trainer, "__init__", lambda trainer, kwargs: kwargs, overrides("L.Trainer"))

    class GlmperfCallback(base):
        """Measures a Lightning Trainer's fit as a glmperf run (see the module docstring)."""

        def __init__(self, *, tokens_of: TokensOf | None = None,
                     probe_loss: Callable[[Any, Any], Any] | None = None, **options: Any) -> None:
            self._run = CallbackRun(options)
            self._tokens_of = tokens_of or batch_tokens
            self._probe_loss = probe_loss
            self._losses: list[Any] = []
            self._kept: Any = None

        @property
        def run(self) -> Any:
            """The api.Run while training runs (None before and after)."""
            return self._run.run

        @property
        def last_run(self) -> Any:
            """The api.Run of the training that ended last (its `dir`, `status`, `summary`)."""
            return self._run.last

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            hparams = dict(pl_module.hparams) if getattr(pl_module, "hparams", None) else {}
            settings = _settings(trainer, pl_module)
            defaults = {"name": type(pl_module).__name__, "config": hparams, "model": trainer.strategy.model,
                        "device": pl_module.device, "amp": AMP.get(settings["precision"].split("-")[0], "off")}
            self._run.open(defaults=defaults, framework={"name": "lightning", "settings": settings},
                           rank=trainer.global_rank, world_size=trainer.world_size)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            step = self.run.current_step
            if step is None:
                step = self.run.begin_step(tokens=0)
                step.micro_batches, self._losses = 0, []
            if self._kept is None:
                self._kept = batch  # what the probes measure on at the train end
            step.tokens += int(self._tokens_of(batch))
            step.micro_batches += 1
            step.batch_size = _batch_size(batch)
            self.run.switch_phase("forward")

        def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
            if self.run.current_step is not None:
                self.run.switch_phase("backward")

        def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
            if self.run.current_step is not None:
                self.run.switch_phase(None)

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            if self.run.current_step is not None:
                self.run.switch_phase("optimizer")
                self.run.current_step.lr = float(optimizer.param_groups[0]["lr"])

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            step = self.run.current_step
            if step is None:
                return
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None:
                self._losses.append(loss.detach() if hasattr(loss, "detach") else float(loss))
            self.run.switch_phase(None)
            if (batch_idx + 1) % trainer.accumulate_grad_batches and not trainer.is_last_batch:
                return  # the optimizer steps after a later batch
            if self._losses:
                step.loss = sum(self._losses) / len(self._losses)
            self.run.end_step()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if self._probe_loss is not None and self._kept is not None and trainer.global_rank == 0:
                kept, loss_of = self._kept, self._probe_loss
                self.run.probe(pl_module, lambda: _loss(loss_of(pl_module, kept)), tokens=int(self._tokens_of(kept)))
            self._kept = None
            self._run.close(None)

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            if self.run is not None:
                self.run.abandon_step()
            self._run.close(exception)

    return GlmperfCallback


AMP = {"bf16": "bf16", "16": "fp16"}
"""Lightning's precision (before its `-mixed`/`-true`) -> api.run's `amp`."""


def _settings(trainer: Any, pl_module: Any) -> dict[str, Any]:
    """What the advice checks its changes against: the Trainer's arguments, the module's compilation and
    optimizer, and the train DataLoader's arguments where it is one loader."""
    optimizer = trainer.optimizers[0] if trainer.optimizers else None
    settings = {"precision": str(trainer.precision), "accumulate_grad_batches": trainer.accumulate_grad_batches,
                "strategy": type(trainer.strategy).__name__,
                "compile": getattr(pl_module, "_compiler_ctx", None) is not None}
    if optimizer is not None:
        settings.update(optimizer=type(optimizer).__name__, fused=bool(optimizer.defaults.get("fused")))
    loader = trainer.train_dataloader
    if isinstance(loader, torch.utils.data.DataLoader):
        settings.update(num_workers=loader.num_workers, pin_memory=loader.pin_memory, batch_size=loader.batch_size)
    return settings


def _loss(output: Any) -> Any:
    """training_step's loss: the output itself, or its `loss`."""
    return output["loss"] if isinstance(output, dict) else output


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when it has none)."""
    first: Any = batch.get("input_ids", next(iter(batch.values()), None)) if isinstance(batch, dict) else \
        batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    return int(first.shape[0]) if hasattr(first, "shape") and len(first.shape) else 0


def __getattr__(name: str) -> Any:
    if name == "GlmperfCallback":
        cls = _build()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
