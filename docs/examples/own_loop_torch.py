"""A plain PyTorch training loop measured by glmperf: a few lines around the loop you already have.

    python docs/examples/own_loop_torch.py --runs-dir runs --steps 30

Two ranks (gloo on CPU, NCCL on GPUs), one run with both:

    torchrun --nproc_per_node=2 docs/examples/own_loop_torch.py --runs-dir runs --steps 30

The model is a small causal transformer built from a config (no download); the data is
tokens counting up from a random start (learnable, so the loss falls). It runs on a CPU in well
under a minute.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from profiler import api

CONFIG = {"vocab_size": 512, "d_model": 64, "n_heads": 4, "n_layers": 2, "seq_len": 64, "batch_size": 8,
          "lr": 3e-4}


class TinyLM(nn.Module):
    """Embedding, a causal transformer encoder, a head: a decoder LM in a dozen lines."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        layer = nn.TransformerEncoderLayer(cfg["d_model"], cfg["n_heads"], 4 * cfg["d_model"], batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, cfg["n_layers"])
        self.head = nn.Linear(cfg["d_model"], cfg["vocab_size"])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.head(self.blocks(self.embed(ids), mask=mask, is_causal=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--name", default="own-loop")
    args = parser.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if distributed:
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = TinyLM(CONFIG).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=CONFIG["lr"])
    starts = torch.randint(0, CONFIG["vocab_size"], (args.steps * CONFIG["batch_size"], 1))
    data = (starts + torch.arange(CONFIG["seq_len"] + 1)) % CONFIG["vocab_size"]  # counting: learnable
    loader = torch.utils.data.DataLoader(data, batch_size=CONFIG["batch_size"])
    steps = tokens = 0

    # --- glmperf: the run around the loop, a step per iteration, a phase per part -----------------
    with api.run(name=args.name, runs_dir=args.runs_dir, config=CONFIG, model=model) as run:
        batches = iter(loader)
        for _ in range(args.steps):
            with run.step(tokens=CONFIG["batch_size"] * CONFIG["seq_len"]) as step:
                with run.phase("data"):
                    batch = next(batches)
                with run.phase("h2d"):
                    batch = batch.to(device, non_blocking=True)
                with run.phase("forward"):
                    logits = model(batch[:, :-1])
                    loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
                with run.phase("backward"):
                    loss.backward()
                with run.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                step.loss = loss.detach()
            steps, tokens = steps + 1, tokens + batch[:, :-1].numel()
        # --- glmperf: the autocast change measured on this model and the last batch (rank 0; a few seconds);
        # under DDP through the module inside it, whose backward makes no all-reduce the other ranks would wait on
        inner = model.module if distributed else model
        x, y = batch[:, :-1], batch[:, 1:]
        run.probe(inner, lambda: nn.functional.cross_entropy(inner(x).flatten(0, 1), y.flatten()), tokens=x.numel())

    rank = int(os.environ.get("RANK", 0))
    print(f"rank {rank} did: steps={steps} tokens={tokens}", flush=True)
    if rank == 0:
        print(f"run: {run.dir} ({run.status})")
        print("look at it with:")
        for command in ("runs", f"show {run.dir.name}", f"diagnose {run.dir.name}", f"report {run.dir.name}",
                        "dashboard"):
            print(f"  glmperf {command} --runs-dir {args.runs_dir}")
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
