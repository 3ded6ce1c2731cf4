"""Training data: a byte tokenizer, corpora, a token cache on disk, and a step-keyed loader.

The samples of global step s, micro-batch m are a pure function of (seed, s, m): the whole
global batch (batch_size * world_size windows) is drawn from a generator seeded with
(seed, s, m) and rank r takes slice [r*B, (r+1)*B). So a loader started at step k yields the
batches an uninterrupted run yields at step k (exact checkpoint resume), and 2 ranks of batch B
see the samples 1 rank of batch 2B sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from optimizers.config import ConfigError
from reference_model.config import BYTE_VOCAB, DataConfig
from reference_model.corpus import ALLOWED, resolve_corpus
from reference_model.infilling import build_blank_infilling_sample, collate_blank_infilling, source_length

# --------------------------------------------------------------------------------------------
# Tokenizer: bytes are tokens (nothing to download), then GLM's special tokens.

MASK, SMASK, GMASK, SOP, EOP, CLS, EOS, PAD = range(BYTE_VOCAB, BYTE_VOCAB + 8)
SPECIAL_TOKENS = {MASK: "[MASK]", SMASK: "[sMASK]", GMASK: "[gMASK]", SOP: "<|startofpiece|>",
                  EOP: "<|endofpiece|>", CLS: "[CLS]", EOS: "<|endoftext|>", PAD: "<pad>"}
VOCAB_SIZE = BYTE_VOCAB + len(SPECIAL_TOKENS)  # 264
TOKENIZER_VERSION = "byte-v1"
"""Part of the token cache key: change it when encoding changes."""


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; GLM's special tokens are 256..263 (module constants)."""

    vocab_size = VOCAB_SIZE
    special_tokens = SPECIAL_TOKENS

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of `text`. Special-token names in the text stay plain bytes."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Any) -> str:
        """Bytes decoded as UTF-8 (invalid sequences replaced); special ids rendered by name."""
        out: list[str] = []
        run = bytearray()
        for i in (int(x) for x in ids):
            if 0 <= i < BYTE_VOCAB:
                run.append(i)
                continue
            if i not in SPECIAL_TOKENS:
                raise ValueError(f"token id {i} out of range 0..{VOCAB_SIZE - 1}")
            out += [run.decode("utf-8", errors="replace"), SPECIAL_TOKENS[i]]
            run = bytearray()
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


def _cache_dir(cfg: DataConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("GLMPERF_CACHE") or "~/.cache/glmperf/tokens"
    return Path(os.path.expanduser(root))


def token_dtype(vocab_size: int = VOCAB_SIZE) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


def cache_path(cfg: DataConfig, files: list[Path]) -> Path:
    """The cache file of these files: keyed by paths, sizes, mtimes, max_corpus_mb, tokenizer."""
    dtype = token_dtype()
    stats = [(str(p), st.st_size, st.st_mtime_ns) for p in files for st in [p.stat()]]
    key = json.dumps([TOKENIZER_VERSION, dtype.name, cfg.max_corpus_mb, stats])
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return _cache_dir(cfg) / f"tokens-{digest}.{dtype.name}.bin"


def _write_tokens(files: list[Path], out: Any, max_bytes: int, dtype: np.dtype) -> int:
    """Stream the files' bytes as tokens, documents joined with EOS; returns the token count."""
    eos = np.array([EOS], dtype=dtype).tobytes()
    read = written = 0
    for path in files:
        if read >= max_bytes:
            break
        with open(path, "rb") as f:
            data = f.read(max_bytes - read)
        if not data or b"\0" in data[:8192]:
            continue  # empty or binary
        if written:
            out.write(eos)
            written += 1
        # Bytes are tokens: widening uint8 -> uint16 is the whole tokenizer.
        out.write(np.frombuffer(data, dtype=np.uint8).astype(dtype).tobytes())
        read += len(data)
        written += len(data)
    return written


def load_tokens(cfg: DataConfig) -> np.ndarray | None:
    """The corpus as a read-only memmap of token ids (None for `synthetic`).

    The first call tokenizes up to cfg.max_corpus_mb MiB of text into a cache file (written to a
    temp file in the same directory, then os.replace'd, so concurrent runs never see half a
    file); later calls open it with np.memmap(mode="r"), no copy.
    """
    files = resolve_corpus(cfg.corpus)
    if files is None:
        return None
    path = cache_path(cfg, files)
    dtype = token_dtype()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".bin", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                _write_tokens(files, out, int(cfg.max_corpus_mb * 2**20), dtype)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    if path.stat().st_size == 0:
        raise ConfigError("data.corpus", f"{cfg.corpus} holds no text; {ALLOWED}")
    return np.memmap(path, dtype=dtype, mode="r")


# --------------------------------------------------------------------------------------------
# Sampler: which windows make up each step's micro-batches.


class StepBatchSampler(Sampler):
    """Yields, for steps start_step, start_step+1, ..., each micro-batch's list of
    (window_start, sample_seed) items; it never ends (the trainer stops asking).

    `batch_size` (per rank) may be changed between steps (dynamic batching); it is read once per
    step. With loader workers the sampler runs ahead by num_workers * prefetch_factor batches, so
    a change reaches the trainer that many batches later (at once with num_workers=0).
    """

    def __init__(self, *, num_starts: int, batch_size: int, seed: int, start_step: int = 0,
                 accumulation_steps: int = 1, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in 0..{world_size - 1}")
        self.num_starts, self.batch_size, self.seed = num_starts, batch_size, seed
        self.start_step, self.accumulation_steps = start_step, accumulation_steps
        self.rank, self.world_size = rank, world_size

    def items(self, step: int, micro: int, batch_size: int | None = None) -> list[tuple[int, int]]:
        """This rank's items of (step, micro): a pure function of (seed, step, batch size).

        The step's global batch (batch x ranks x micro-batches samples) is drawn at once and sliced
        micro-batch-major, so 1 x 8, 4 micro-batches x 2 and 2 ranks x 4 all see the same samples:
        comparing those runs measures the switch, not different data.
        """
        bsz = self.batch_size if batch_size is None else batch_size
        rng = np.random.default_rng([self.seed % 2**63, step])
        total = bsz * self.world_size * self.accumulation_steps
        starts = rng.integers(0, self.num_starts, size=total)
        seeds = rng.integers(0, 2**63 - 1, size=total)
        lo = (micro * self.world_size + self.rank) * bsz
        return [(int(a), int(b)) for a, b in zip(starts[lo:lo + bsz], seeds[lo:lo + bsz], strict=True)]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        step = self.start_step
        while True:
            bsz = self.batch_size
            for micro in range(self.accumulation_steps):
                yield self.items(step, micro, bsz)
            step += 1


# --------------------------------------------------------------------------------------------
# Dataset and collate functions


class WindowDataset(Dataset):
    """Maps an item (window_start, sample_seed) to a sample: a token window (causal, seq_len+1
    tokens) or a blank-infilling sample. Pickles without its tokens: a worker reopens the memmap
    (or inherits it by fork), so the token array is never copied."""

    def __init__(self, tokens: np.ndarray | None, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.tokens = tokens
        self._path = getattr(tokens, "filename", None)
        if cfg.objective == "causal":
            self.window_len = cfg.seq_len + 1
        else:
            self.window_len = source_length(cfg.seq_len, cfg.mask_ratio)
        if tokens is not None and len(tokens) < self.window_len:
            raise ConfigError("data.corpus", f"{cfg.corpus} has {len(tokens)} tokens, fewer than one "
                              f"window of {self.window_len}; {ALLOWED}")

    @property
    def num_starts(self) -> int:
        return 1 if self.tokens is None else len(self.tokens) - self.window_len + 1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self._path is not None:
            assert self.tokens is not None, "a path is a memmap's filename: tokens come with it"
            state["tokens"] = None
            state["_dtype"] = self.tokens.dtype
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        dtype = state.pop("_dtype", None)
        self.__dict__.update(state)
        if self._path is not None:
            self.tokens = np.memmap(self._path, dtype=dtype, mode="r")

    def window(self, start: int, seed: int) -> np.ndarray:
        if self.tokens is None:  # synthetic: the window comes from its seed alone
            return np.random.default_rng(seed).integers(0, BYTE_VOCAB, size=self.window_len)
        return np.asarray(self.tokens[start:start + self.window_len], dtype=np.int64)

    def __getitem__(self, item: tuple[int, int]) -> Any:
        start, seed = item
        tokens = self.window(start, seed)
        if self.cfg.objective == "causal":
            return torch.from_numpy(tokens)
        return build_blank_infilling_sample(tokens, random.Random(seed), mask_ratio=self.cfg.mask_ratio,
                                            mean_span=self.cfg.mean_span)


class Collate:
    """Batches samples; sleeps io_delay_ms once per batch first (a slow input pipeline)."""

    def __init__(self, objective: str, seq_len: int, io_delay_ms: float = 0.0) -> None:
        self.objective, self.seq_len, self.io_delay_ms = objective, seq_len, io_delay_ms

    def __call__(self, samples: list[Any]) -> dict[str, torch.Tensor]:
        if self.io_delay_ms > 0:
            time.sleep(self.io_delay_ms / 1000)
        if self.objective == "causal":
            windows = torch.stack(samples)  # (B, T+1)
            # labels[:, t] is the token after input_ids[:, t]: aligned, the model does no shift.
            return {"input_ids": windows[:, :-1].contiguous(), "labels": windows[:, 1:].contiguous()}
        return collate_blank_infilling(samples, self.seq_len)


# --------------------------------------------------------------------------------------------
# Loader

_OWN_KWARGS = {"batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last"}


class TrainLoader:
    """An endless iterable of batches (dicts of tensors) for steps start_step, start_step+1, ...

    `sampler.batch_size` may be changed between steps; `tokens` is the corpus array (None for
    synthetic); `dataloader` is the torch DataLoader underneath. Each `iter()` starts again at
    start_step, so iterate once and keep the iterator.
    """

    def __init__(self, dataloader: DataLoader, sampler: StepBatchSampler, tokens: np.ndarray | None,
                 cfg: DataConfig) -> None:
        self.dataloader, self.sampler, self.tokens, self.cfg = dataloader, sampler, tokens, cfg
        self.vocab_size = VOCAB_SIZE

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter(self.dataloader)


def build_loader(cfg: DataConfig, *, batch_size: int, seed: int, start_step: int = 0,
                 accumulation_steps: int = 1, rank: int = 0, world_size: int = 1,
                 loader_options: dict[str, Any] | None = None) -> TrainLoader:
    """The training loader of this rank: batches of `batch_size` samples, accumulation_steps
    micro-batches per step, from start_step on. loader_options are DataLoader kwargs
    (num_workers, pin_memory, prefetch_factor, persistent_workers, ...)."""
    options = dict(loader_options or {})
    clash = _OWN_KWARGS & options.keys()
    if clash:
        raise ValueError(f"loader_options may not set {sorted(clash)}: build_loader owns them")
    if options.get("num_workers", 0) == 0:
        options.pop("prefetch_factor", None)
        options.pop("persistent_workers", None)
    tokens = load_tokens(cfg)
    dataset = WindowDataset(tokens, cfg)
    sampler = StepBatchSampler(num_starts=dataset.num_starts, batch_size=batch_size, seed=seed,
                               start_step=start_step, accumulation_steps=accumulation_steps,
                               rank=rank, world_size=world_size)
    loader = DataLoader(dataset, batch_sampler=sampler,
                        collate_fn=Collate(cfg.objective, cfg.seq_len, cfg.io_delay_ms), **options)
    return TrainLoader(loader, sampler, tokens, cfg)
