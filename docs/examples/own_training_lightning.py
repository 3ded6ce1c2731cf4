"""A Lightning training measured by glmperf: one callback.

    pip install -e '.[lightning]'
    python docs/examples/own_training_lightning.py --runs-dir runs --steps 30

The model is the plain-loop example's small causal transformer (own_loop_torch.py, beside this
file), built from its config (no download), in a LightningModule; the data is tokens counting up
from a random start. It runs on a CPU in well under a minute.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from own_loop_torch import CONFIG, TinyLM
from torch import nn

from profiler.integrations.lightning import GlmperfCallback


class CountingLM(L.LightningModule):
    def __init__(self, lr: float = CONFIG["lr"]) -> None:
        super().__init__()
        self.save_hyperparameters()  # recorded as the run's config
        self.model = TinyLM(CONFIG)
        self.batches = self.tokens = 0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.batches, self.tokens = self.batches + 1, self.tokens + batch[:, :-1].numel()
        logits = self.model(batch[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--name", default="own-lightning")
    args = parser.parse_args()

    torch.manual_seed(0)
    starts = torch.randint(0, CONFIG["vocab_size"], (args.steps * CONFIG["batch_size"], 1))
    data = (starts + torch.arange(CONFIG["seq_len"] + 1)) % CONFIG["vocab_size"]
    loader = torch.utils.data.DataLoader(data, batch_size=CONFIG["batch_size"])
    module = CountingLM()
    # --- glmperf: one callback -------------------------------------------------------------------
    glmperf = GlmperfCallback(name=args.name, runs_dir=args.runs_dir, tokens_of=lambda b: b[:, :-1].numel())
    trainer = L.Trainer(max_steps=args.steps, callbacks=[glmperf], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader)

    print(f"rank {trainer.global_rank} did: steps={module.batches} tokens={module.tokens}", flush=True)
    if trainer.global_rank == 0:
        run = glmperf.last_run
        print(f"run: {run.dir} ({run.status})")
        print("look at it with:")
        for command in ("runs", f"show {run.dir.name}", f"diagnose {run.dir.name}", f"report {run.dir.name}",
                        "dashboard"):
            print(f"  glmperf {command} --runs-dir {args.runs_dir}")


if __name__ == "__main__":
    main()
