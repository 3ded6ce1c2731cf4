"""A Hugging Face Trainer measured by glmperf: one callback.

    pip install -e '.[hf]'
    python docs/examples/own_training_hf.py --runs-dir runs --steps 30 [--width 512] [--read-ms 20]

`--width` sets the model's hidden size (large enough, bf16 pays on a CPU with native bf16); `--read-ms`
has every sample's read wait that long (a slow store: an input-bound step).

The model is a small GPT-2 built from a config (no download); the data is tokens counting up from
a random start (learnable, so the loss falls). It runs on a CPU in well under a minute.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from profiler.integrations.hf import GlmperfCallback

MODEL = {"vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4,
         "bos_token_id": 0, "eos_token_id": 0}  # inside the vocabulary (GPT-2's default 50256 is not)
SEQ_LEN, BATCH_SIZE = 64, 8


class Counting(torch.utils.data.Dataset):
    """Sequences of tokens counting up (mod the vocabulary) from a random start, each read after `read_s`."""

    def __init__(self, n: int, read_s: float = 0.0) -> None:
        starts = torch.randint(0, MODEL["vocab_size"], (n, 1), generator=torch.Generator().manual_seed(0))
        self.ids = (starts + torch.arange(SEQ_LEN)) % MODEL["vocab_size"]
        self.read_s = read_s

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(self.read_s)
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--name", default="own-hf")
    parser.add_argument("--width", type=int, default=MODEL["n_embd"], help="hidden size (a multiple of 64)")
    parser.add_argument("--read-ms", type=float, default=0.0, help="each sample's read time")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**{**MODEL, "n_embd": args.width, "n_head": max(4, args.width // 64)}))
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=BATCH_SIZE,
                                     learning_rate=1e-3, logging_steps=10, save_strategy="no", report_to="none",
                                     use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
                                     disable_tqdm=True, include_num_input_tokens_seen=True)
        # --- glmperf: one callback; as a context manager it also records a crash at once ----------
        with GlmperfCallback(name=args.name, runs_dir=args.runs_dir, config={"model": MODEL, "seq_len": SEQ_LEN}
                             ) as glmperf:
            data = Counting(args.steps * BATCH_SIZE, args.read_ms / 1e3)
            trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[glmperf])
            trainer.train()

    rank = int(os.environ.get("RANK", 0))
    # the Trainer's own counts (tokens summed over the ranks), to hold the run's against
    state = trainer.state
    print(f"rank {rank} did: steps={state.global_step} tokens={state.num_input_tokens_seen}", flush=True)
    if rank == 0:
        run = glmperf.last_run
        print(f"run: {run.dir} ({run.status})")
        print("look at it with:")
        for command in ("runs", f"show {run.dir.name}", f"diagnose {run.dir.name}", f"report {run.dir.name}",
                        "dashboard"):
            print(f"  glmperf {command} --runs-dir {args.runs_dir}")


if __name__ == "__main__":
    main()
