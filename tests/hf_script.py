"""A user's Hugging Face Trainer script, as tests/test_rerun.py reruns it: a small GPT-2 from a config, a
dataset that may read slowly, the glmperf callback.

    python tests/hf_script.py --runs-dir RUNS [--steps N] [--read-ms MS] [--width N] [--args-first]

`--width` is the model's hidden size (64; 512 makes matmuls large enough for bf16 to pay on a CPU
with native bf16).
`--args-first` builds the TrainingArguments before the callback is imported: a script shape a rerun
cannot change (it must be refused, not measured unchanged).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

MODEL = {"vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_layer": 1, "n_head": 4, "bos_token_id": 0,
         "eos_token_id": 0}
SEQ_LEN, BATCH = 64, 4
PROFILE = {"trace_window": [1, 1, 1], "sample_hz": 20, "flush_interval_s": 0.2, "warmup_steps": 1}


class Counting(torch.utils.data.Dataset):
    """Token sequences counting up; each read sleeps `read_s` (a slow store)."""

    def __init__(self, n: int, read_s: float) -> None:
        self.n, self.read_s = n, read_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(self.read_s)
        ids = (torch.arange(SEQ_LEN) + i) % MODEL["vocab_size"]
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--read-ms", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--args-first", action="store_true")
    args = parser.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    with tempfile.TemporaryDirectory() as out:
        def training() -> TrainingArguments:
            return TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=BATCH,
                                     learning_rate=1e-3, save_strategy="no", report_to="none", use_cpu=True,
                                     dataloader_num_workers=0, disable_tqdm=True, seed=0)

        made = training() if args.args_first else None
        from profiler.integrations.hf import GlmperfCallback

        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(**{**MODEL, "n_embd": args.width, "n_head": max(4, args.width // 64)}))
        data = Counting((args.steps + 2) * BATCH, args.read_ms / 1e3)
        with GlmperfCallback(name="own-hf-script", runs_dir=args.runs_dir, profile=PROFILE) as glmperf:
            Trainer(model=model, args=made or training(), train_dataset=data, callbacks=[glmperf]).train()


if __name__ == "__main__":
    main()
