"""glmperf for the Hugging Face Trainer: `Trainer(..., callbacks=[GlmperfCallback(name=..., runs_dir=...)])`.

Takes api.run's keywords (profiler.api.OPTIONS; `config` defaults to the TrainingArguments, `model`
to the Trainer's model, `name` to `run_name`, `amp` to their `bf16`/`fp16`) and `tokens_of`, a
function of a batch giving its input tokens (default: the `input_ids` the model's forward receives).
Importing this module imports nothing of transformers; the callback class is built on first use,
with one clear error naming the `hf` extra when transformers is missing.

What it measures, from the Trainer's own events, hooks on the model's forward and the train
dataloader's iterator:

- a step is one optimizer step, from the fetch of its first batch (else `on_step_begin`) to
  `on_step_end` (all its micro-batches);
- `data`: fetching each batch from the train dataloader (the Trainer fetches a step's batches before
  `on_step_begin`, so the callback times its dataloader's iterator);
- `forward`: each forward of the model (its pre- and post-forward hooks); `backward`: from the end
  of a forward to the next forward or the optimizer (the loss's backward, and gradient clipping);
  `optimizer`: `on_pre_optimizer_step` to `on_step_end` (optimizer and scheduler step, zero_grad);
- tokens: the `input_ids` of every forward in the step; the loss: the mean of the forwards' `loss`;
- under torchrun (DDP) each rank writes its part of one run; all-reduces are not counted (the
  Trainer wraps the model itself), so `comm` is "not measured".

Under `glmperf recommend RUN --verify -- COMMAND` (profiler.experiments.rerun), importing the callback
has every TrainingArguments built afterwards take the change the rerun asks for.

At the train end, the callback measures the advice's autocast change on the model and the first
training batch (profiler.capture.own_probe; `profile={"probe_budget_s": 0}` turns it off), so the
advice's range for it is measured on this model.

The run records the TrainingArguments of SETTINGS (run.json config.framework), which the advice
checks its changes against (profiler.advice.framework). The run ends at `on_train_end`. An exception
the Trainer raises skips that event: the run then ends when the interpreter exits, `failed` with the
error (`interrupted` on Ctrl-C or SIGTERM); use the callback as a context manager (`with
GlmperfCallback(...) as cb: trainer.train()`) to end it at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from profiler.integrations.common import (
    CallbackRun,
    TokensOf,
    batch_tokens,
    overrides,
    require,
    take_overrides,
    time_fetches,
)

SETTINGS = ("bf16", "fp16", "tf32", "torch_compile", "gradient_checkpointing", "dataloader_num_workers",
            "dataloader_pin_memory", "optim", "gradient_accumulation_steps", "per_device_train_batch_size",
            "ddp_bucket_cap_mb")
"""The TrainingArguments a run records: those the advice's changes are made of."""


def _set(args: Any, wanted: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments.__post_init__ taking a rerun's values before it derives anything from them."""
    for name, value in wanted.items():
        if not hasattr(args, name):
            raise ValueError(f"TrainingArguments has no {name!r}: the rerun's change cannot be made here")
        setattr(args, name, value)
    return {}


def _build() -> type:
    transformers = require("transformers", extra="hf", what="profiler.integrations.hf.GlmperfCallback")
    base: Any = transformers.TrainerCallback  # known once the framework is imported
    take_overrides(transformers.TrainingArguments, "__post_init__", _set, overrides("TrainingArguments"))

    class GlmperfCallback(base):
        """Measures a Trainer's training as a glmperf run (see the module docstring)."""

        def __init__(self, *, tokens_of: TokensOf | None = None, **options: Any) -> None:
            self._run = CallbackRun(options)
            self._tokens_of = tokens_of
            self._handles: list[Any] = []
            self._losses: list[Any] = []
            self._batch_size = 0
            self._untime: Callable[[], None] = lambda: None
            self._kept: dict[str, Any] | None = None  # the first training batch: what the probes measure on

        @property
        def run(self) -> Any:
            """The api.Run while training runs (None before and after)."""
            return self._run.run

        @property
        def last_run(self) -> Any:
            """The api.Run of the training that ended last (its `dir`, `status`, `summary`)."""
            return self._run.last

        def __enter__(self) -> GlmperfCallback:
            return self

        def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
            self._end(exc)

        # -- the Trainer's events -------------------------------------------------------------
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                           train_dataloader: Any = None, **kwargs: Any) -> None:
            amp = "bf16" if args.bf16 else "fp16" if args.fp16 else "off"
            defaults = {"name": args.run_name or "hf-trainer", "config": args.to_sanitized_dict(), "model": model,
                        "amp": amp}
            framework = {"name": "hf", "settings": {k: getattr(args, k) for k in SETTINGS if hasattr(args, k)}}
            self._run.open(defaults=defaults, framework=framework, rank=args.process_index,
                           world_size=args.world_size)
            self._batch_size = args.per_device_train_batch_size
            if model is not None:
                self._handles = [model.register_forward_pre_hook(self._forward_start, with_kwargs=True),
                                 model.register_forward_hook(self._forward_end)]
            if train_dataloader is not None:
                self._untime = time_fetches(train_dataloader, self._fetch)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.run.current_step is None:  # else it began with the fetch of its batches
                self._begin_step()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                                  **kwargs: Any) -> None:
            self.run.switch_phase("optimizer")
            if optimizer is not None:
                self.run.current_step.lr = float(optimizer.param_groups[0]["lr"])

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.run.switch_phase(None)
            if self._losses:
                self.run.current_step.loss = sum(self._losses) / len(self._losses)
            self.run.end_step()

        def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if model is not None and self._kept is not None and args.process_index == 0:
                kept = self._kept
                self.run.probe(model, lambda: model(**kept).loss, tokens=batch_tokens(kept))
            self._end(None)

        # -- the train dataloader's fetches and the model's forward --------------------------------
        def _fetch(self, next_batch: Callable[[], Any]) -> Any:
            if self.run is None:
                return next_batch()
            if self.run.current_step is None:
                self._begin_step()
            self.run.switch_phase("data")
            try:
                return next_batch()
            finally:
                self.run.switch_phase(None)

        def _forward_start(self, module: Any, args: tuple, kwargs: dict) -> None:
            step = self.run.current_step if self.run is not None else None
            if step is None:
                return  # evaluation or prediction: not a training step
            batch = kwargs if "input_ids" in kwargs else args
            if self._kept is None and isinstance(batch, dict):
                self._kept = dict(batch)
            step.tokens += self._tokens_of(batch) if self._tokens_of is not None else batch_tokens(batch)
            step.micro_batches += 1
            self.run.switch_phase("forward")

        def _forward_end(self, module: Any, args: tuple, output: Any) -> None:
            if self.run is None or self.run.current_step is None:
                return
            loss = output.get("loss") if hasattr(output, "get") else None
            if loss is not None:
                self._losses.append(loss.detach())
            self.run.switch_phase("backward")

        # -- internals ------------------------------------------------------------------------
        def _begin_step(self) -> None:
            step = self.run.begin_step(tokens=0, batch_size=self._batch_size)
            step.micro_batches = 0
            self._losses = []

        def _end(self, error: BaseException | None) -> None:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            self._untime()
            self._untime = lambda: None
            self._kept = None
            self._run.close(error)

    return GlmperfCallback


def __getattr__(name: str) -> Any:
    if name == "GlmperfCallback":
        cls = _build()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
