"""The training loop: one loop, the switches' setup, and hooks where instruments attach.

The trainer knows nothing of profiling. It brackets every phase of a step (data, h2d, forward,
backward, optimizer, checkpoint) with hook calls and hands each hook the step's figures at the
end. The trainer itself never reads a device value unless a switch needs it (the NaN guard's
check, the plateau schedule's loss: each says so in its setup note): loss and grad norm reach the
hooks as device tensors plus one `LazyScalars` copy, and the loss watch reads them when the device
has produced them, so the host can run ahead of the device as it does without any of us.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from optimizers import SetupContext, SwitchesConfig, TrainSetup, apply_all
from reference_model.checkpoint import load_latest, save_checkpoint
from reference_model.config import DataConfig, GLMConfig, TrainConfig
from reference_model.context import setup_context
from reference_model.data import build_loader
from reference_model.grads import clip_grads, local_part, total_grad_norm
from reference_model.hooks import StepRecord, TrainerHook, TrainResult, TrainStart
from reference_model.layout_state import full_state, load_full_state, state_layout
from reference_model.lazy import LazyScalars
from reference_model.model import IGNORE_INDEX, GLMForCausalLM
from reference_model.rollback import Rollback

log = logging.getLogger("glmperf.trainer")


class NonFiniteLossError(RuntimeError):
    """The NaN/Inf guard's `stop` policy ended the run (a debug checkpoint was saved)."""


class Trainer:
    """Builds model, setup and loader from config, then `fit()` runs the loop.

    `ctx` is the setup context built by `setup_context` (the profiler builds it once per run and
    hands it down); without one the trainer builds it from the config and this process's environment.
    """

    def __init__(self, *, model_cfg: GLMConfig, data_cfg: DataConfig, train_cfg: TrainConfig,
                 switches: SwitchesConfig | None = None, hooks: Sequence[TrainerHook] = (),
                 run_dir: Path | None = None, ctx: SetupContext | None = None) -> None:
        self.model_cfg, self.data_cfg, self.train_cfg = model_cfg, data_cfg, train_cfg
        self.switches = switches or SwitchesConfig()
        self.hooks = list(hooks)
        self.run_dir = run_dir
        self.ctx = ctx if ctx is not None else setup_context(train_cfg, data_cfg, model=model_cfg)
        self.device = self.ctx.device
        self._watching: deque[tuple[int, LazyScalars]] = deque()
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)
        torch.manual_seed(train_cfg.seed)
        self.model = GLMForCausalLM(model_cfg).to(self.device)
        self.setup: TrainSetup = apply_all(self.model, self.switches, self.ctx)
        self.params = [p for p in self.setup.raw_model.parameters() if p.requires_grad]
        self.start_step = 0
        self.state_layout = state_layout(self.setup, self.switches.parallel)
        ck = self.switches.checkpoint
        self.checkpoint_dir = Path(ck.dir) if ck.dir else (run_dir / "checkpoints" if run_dir else None)
        if ck.resume:
            self._resume()
        self.rollback = Rollback(self.switches.stability, self.setup, self.start_step, self.device) \
            if self.setup.nan_guard == "rollback" else None
        # ranks of one data-parallel replica (a tensor-parallel group) read the same batch
        replica, replicas = self.setup.data_shard or (self.ctx.rank, self.ctx.world_size)
        self.loader = build_loader(
            data_cfg, batch_size=self._batch_size(), seed=train_cfg.seed, start_step=self.start_step,
            accumulation_steps=self.setup.accumulation_steps, rank=replica,
            world_size=replicas, loader_options=self.setup.loader_options)
        self.flops_per_token = self.model.flops_per_token(data_cfg.seq_len)  # the setup's raw_model
        self.attention_flops_per_token = self.model.attention_flops_per_token(data_cfg.seq_len)

    # -- hooks ------------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> None:
        for hook in self.hooks:
            getattr(hook, name)(*args)

    @contextlib.contextmanager
    def phase(self, step: int, name: str) -> Iterator[None]:
        self._call("on_phase_start", step, name)
        try:
            yield
        finally:
            self._call("on_phase_end", step, name)

    def emit(self, event: dict[str, Any]) -> None:
        log.info("event %s", event)
        self._call("on_event", event)

    # -- state ------------------------------------------------------------------------------
    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The setup's optimizer, which `apply_all` always builds (the optimizer switch is applied in every
        setup, its defaults included); `TrainSetup.optimizer` is None only while the switches apply."""
        optimizer = self.setup.optimizer
        assert optimizer is not None, "apply_all builds the optimizer: switches.optimizer is always applied"
        return optimizer

    def _batch_size(self) -> int:
        ctl = self.setup.batch_controller
        return ctl.batch_size if ctl is not None else self.train_cfg.batch_size

    def held_bytes(self) -> dict[str, int]:
        """Bytes of parameters, gradients and optimizer state this rank holds (its shards only under a
        sharded layout); the optimizer's state exists after the first step."""
        def local(t: torch.Tensor) -> int:
            t = local_part(t)
            return t.numel() * t.element_size()

        params = list({id(p): p for p in self.setup.raw_model.parameters()}.values())
        state = self.optimizer.state.values()
        return {"params": sum(local(p) for p in params),
                "grads": sum(local(p.grad) for p in params if p.grad is not None),
                "optimizer": sum(local(v) for s in state for v in s.values() if isinstance(v, torch.Tensor))}

    def state_dict(self, step: int) -> dict[str, Any] | None:
        """The checkpoint after `step` on rank 0 (None elsewhere): model and optimizer in the one-process
        form (reference_model.layout_state), so that any layout resumes it."""
        s = self.setup
        full = full_state(s.raw_model, self.optimizer, self.state_layout)
        if full is None:
            return None
        return {
            "step": step, "model": full[0], "optimizer": full[1],
            "scheduler": s.scheduler.state_dict() if s.scheduler is not None else None,
            "scaler": s.scaler.state_dict() if s.scaler is not None else None,
            "batch_size": self._batch_size(), "torch_rng": torch.get_rng_state(),
        }

    def _saves_here(self) -> bool:
        """Whether this rank takes part in a save: rank 0, or every rank when saving gathers shards."""
        return self.ctx.rank == 0 or self.state_layout.collective

    def _resume(self) -> None:
        if self.checkpoint_dir is None:
            raise ValueError("switches.checkpoint.resume needs switches.checkpoint.dir or a run directory")
        # on the CPU: the RNG state must stay a CPU tensor; load_state_dict moves the rest to the device
        found = load_latest(self.checkpoint_dir, map_location="cpu")
        if found is None:
            log.warning("resume: no readable checkpoint in %s; starting from step 0", self.checkpoint_dir)
            return
        step, state, path = found
        s = self.setup
        load_full_state(s.raw_model, self.optimizer, state["model"], state["optimizer"], self.state_layout)
        if s.scheduler is not None and state["scheduler"] is not None:
            s.scheduler.load_state_dict(state["scheduler"])
        if s.scaler is not None and state["scaler"] is not None:
            s.scaler.load_state_dict(state["scaler"])
        if s.batch_controller is not None:
            s.batch_controller.batch_size = int(state["batch_size"])
        torch.set_rng_state(state["torch_rng"])
        self.start_step = step
        log.info("resumed from %s at step %d", path, step)

    def save(self, step: int, *, debug_batch: dict[str, torch.Tensor] | None = None) -> Path | None:
        """Checkpoint after `step` optimizer steps, written by rank 0 (None elsewhere); every rank of a
        sharded layout must call it, only rank 0 otherwise. A debug save also keeps the batch."""
        assert self.checkpoint_dir is not None
        state = self.state_dict(step)
        if state is None:
            return None
        if debug_batch is not None:
            state["batch"] = {k: v.detach().cpu() for k, v in debug_batch.items()}
            path = self.checkpoint_dir / f"debug-step{step:08d}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, path)
            return path
        return save_checkpoint(self.checkpoint_dir, step, state, keep=self.switches.checkpoint.keep)

    # -- the loop ---------------------------------------------------------------------------
    def train_start(self) -> TrainStart:
        return TrainStart(device=self.device, rank=self.ctx.rank, world_size=self.ctx.world_size,
                          start_step=self.start_step, total_steps=self.train_cfg.steps)

    def fit(self) -> TrainResult:
        result = TrainResult(steps=0, final_step=self.start_step)
        t0 = time.perf_counter()
        self._call("on_train_start", self.train_start())
        try:
            batches = iter(self.loader)
            for step in range(self.start_step, self.train_cfg.steps):
                self.run_step(step, batches)
                result.steps += 1
                result.final_step = step + 1
            self._watch(wait=True)
            result.elapsed_s = time.perf_counter() - t0
        except BaseException as exc:
            with contextlib.suppress(Exception):  # the steps that finished still get their events
                self._watch(wait=True)
            self._call("on_train_end", None, exc)
            raise
        self._call("on_train_end", result, None)
        return result

    def run_step(self, step: int, batches: Iterator[dict[str, torch.Tensor]]) -> StepRecord:
        """One optimizer step and what follows it (events, checkpoint, batch size, hooks).

        `fit` is this in a loop; benchmarks drive several trainers one step each in turn with it.
        """
        record = self.train_step(step, batches)
        self._after_step(record)
        return record

    def _forward_backward(self, step: int, batch: dict[str, torch.Tensor], weight: torch.Tensor,
                          last: bool) -> torch.Tensor:
        """Backward of this micro-batch's loss times its share of the step's labelled tokens."""
        s = self.setup
        if s.pipeline is not None:  # forward and backward run interleaved inside the schedule
            with self.phase(step, "forward"), torch.autocast(
                    self.device.type, dtype=s.autocast_dtype, enabled=s.autocast_dtype is not None):
                return s.pipeline(batch["input_ids"], batch["labels"]) * weight
        with s.micro_batch(last=last):
            with self.phase(step, "forward"), torch.autocast(
                    self.device.type, dtype=s.autocast_dtype, enabled=s.autocast_dtype is not None):
                loss = s.model(**batch).loss * weight
            with self.phase(step, "backward"):
                (s.scaler.scale(loss) if s.scaler is not None else loss).backward()
        return loss.detach()

    def train_step(self, step: int, batches: Iterator[dict[str, torch.Tensor]]) -> StepRecord:
        s = self.setup
        t0 = time.perf_counter()
        self._call("on_step_start", step)
        self.optimizer.zero_grad(set_to_none=True)
        micro = []
        for _ in range(s.accumulation_steps):
            with self.phase(step, "data"):
                batch = next(batches)
            with self.phase(step, "h2d"):  # never a blocking copy: it would make the host wait for the device
                micro.append({k: v.to(self.device, non_blocking=True) for k, v in batch.items()})
        # Weight each micro-batch by its share of the step's labelled tokens, so N micro-batches give
        # the gradient of one big batch even when label counts differ (blank infilling); with equal
        # counts (causal) every weight is exactly 1/N. Counted on the device: no sync.
        labelled = torch.stack([(b["labels"] != IGNORE_INDEX).sum() for b in micro]).float()
        weights = labelled / labelled.sum().clamp(min=1.0)
        losses = [self._forward_backward(step, b, weights[i], last=i == len(micro) - 1)
                  for i, b in enumerate(micro)]
        batch, tokens = micro[-1], sum(b["input_ids"].numel() for b in micro)
        if s.data_shard is not None:  # world / replicas ranks share each replica's batch
            tokens = tokens * s.data_shard[1] // self.ctx.world_size
        with self.phase(step, "optimizer"):
            loss = torch.stack(losses).sum()  # the mean over every labelled token of the step
            if s.scaler is not None:
                s.scaler.unscale_(self.optimizer)
            grad_norm = total_grad_norm(self.params, group=s.grad_norm_group)
            if s.clip_grad_norm > 0:
                clip_grads(self.params, s.clip_grad_norm, grad_norm)
            skipped = self._guard(step, loss, grad_norm, batch)
            scale = None
            if s.scaler is not None:
                before = s.scaler.get_scale()
                s.scaler.step(self.optimizer)  # skips the update by itself when grads hold inf/NaN
                s.scaler.update()
                scale = s.scaler.get_scale()
                skipped = skipped or scale < before
            elif not skipped:
                self.optimizer.step()
            if not skipped:
                for hook in s.post_step_hooks:
                    hook()
            lr = self.optimizer.param_groups[0]["lr"]
            s.step_scheduler(float(loss) if s.scheduler_wants_loss else None)  # plateau: a sync, noted
        if self.rollback is not None and self.rollback.due(step, skipped):
            with self.phase(step, "checkpoint"):  # a copy of the state in memory, or back to one
                event = self.rollback.settle(step, batches)
            if event is not None:
                self.emit(event)
        grad_norm = grad_norm.detach()
        return StepRecord(step=step, batch_size=batch["input_ids"].shape[0], micro_batches=s.accumulation_steps,
                          tokens=tokens, loss=loss, grad_norm=grad_norm, lr=lr, loss_scale=scale,
                          skipped=skipped, wall_s=time.perf_counter() - t0,
                          warmup=s.compiled and step == self.start_step, values=LazyScalars(loss, grad_norm))

    def _guard(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor,
               batch: dict[str, torch.Tensor]) -> bool:
        """The NaN/Inf guard: True when the step must be skipped; raises under `stop`, or when `rollback` gives up."""
        s = self.setup
        if s.nan_guard == "off":
            return False
        if self.rollback is not None:
            return self._rollback_guard(self.rollback, step, loss, grad_norm)
        # With a GradScaler, inf gradients are the scaler's business; only the loss is checked.
        # One read (one device sync) per step: the price of deciding before the update.
        checked = loss if s.scaler is not None else torch.stack([loss.float(), grad_norm.float()])
        if bool(torch.isfinite(checked).all()):
            return False
        loss_value, norm_value = LazyScalars(loss, grad_norm).values()
        event = {"kind": "non_finite", "step": step, "loss": loss_value, "grad_norm": norm_value,
                 "action": s.nan_guard}
        if s.nan_guard == "stop" and self.checkpoint_dir is not None and self._saves_here():
            path = self.save(step, debug_batch=batch)
            if path is not None:
                event["debug_checkpoint"] = str(path)
        self.emit(event)
        if s.nan_guard == "stop":
            raise NonFiniteLossError(f"non-finite loss/gradients at step {step}: {event}")
        self.optimizer.zero_grad(set_to_none=True)
        return True

    def _rollback_guard(self, rollback: Rollback, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """The rollback policy's decision. The one read of the step's values feeds the monitors at once,
        not lazily (the sync is paid), so a loss spike can roll back the step it happened in."""
        loss_value, norm_value = torch.stack([loss.float(), grad_norm.float()]).tolist()  # one device sync
        events = [e for monitor in self.setup.monitors for e in monitor.observe(step, loss_value, norm_value)]
        for event in events:
            self.emit(event)
        if not rollback.check(step, loss_value, norm_value, events):
            return False
        self.optimizer.zero_grad(set_to_none=True)
        return True

    def _watch(self, *, wait: bool) -> None:
        """Feed the monitors every watched step whose values have reached the host, oldest first.

        Their events (loss spikes, plateaus) are emitted a step or two late on CUDA, with the step
        they belong to; `wait` (train end) drains the rest.
        """
        while self._watching and (wait or self._watching[0][1].ready()):
            step, scalars = self._watching.popleft()
            loss, norm = scalars.values()
            for monitor in self.setup.monitors:
                for event in monitor.observe(step, loss, norm):
                    self.emit(event)

    def _after_step(self, record: StepRecord) -> None:
        s = self.setup
        if s.monitors and self.rollback is None:  # the rollback guard fed them as it decided
            self._watching.append((record.step, record.scalars()))
            self._watch(wait=False)
        every = self.switches.checkpoint.every
        if every and (record.step + 1) % every == 0 and self.checkpoint_dir is not None:
            with self.phase(record.step, "checkpoint"):
                path = self.save(record.step + 1) if self._saves_here() else None
                if path is not None:
                    self.emit({"kind": "checkpoint", "step": record.step + 1, "path": str(path)})
        if s.batch_controller is not None and not record.warmup:  # compile time is not step time
            before = s.batch_controller.batch_size
            after = s.batch_controller.observe(record.wall_s, None)
            if after != before:
                self.loader.sampler.batch_size = after
                self.emit({"kind": "batch_size", "step": record.step, "from": before, "to": after})
        self._call("on_step_end", record)
