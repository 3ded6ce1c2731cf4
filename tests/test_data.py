"""Tokenizer, corpora, the token cache and the step-keyed loader, on real text (stdlib sources)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from optimizers.config import ConfigError
from reference_model.config import DataConfig
from reference_model.corpus import resolve_corpus
from reference_model.data import (
    EOS,
    MASK,
    SOP,
    VOCAB_SIZE,
    ByteTokenizer,
    WindowDataset,
    build_loader,
    load_tokens,
)

# Two real files of a few hundred KiB together: enough windows, tokenized in milliseconds.
SMALL = [random.__file__, os.__file__]


def cfg_for(tmp_path: Path, **kw) -> DataConfig:
    return DataConfig(**{"corpus": SMALL, "cache_dir": str(tmp_path / "cache"), "seq_len": 32, **kw})


def take(loader, n: int) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(loader, n))


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b, strict=True))


def test_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    text = "def f(x):\n    return 'héllo, 世界 🚀'\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.decode([*tok.encode("a"), MASK, *tok.encode("é"), SOP, EOS]) == (
        "a[MASK]é<|startofpiece|><|endoftext|>")
    assert tok.vocab_size == VOCAB_SIZE == 264
    with pytest.raises(ValueError):
        tok.decode([VOCAB_SIZE])


def test_resolve_corpus(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_corpus([str(tmp_path / "missing*.txt")])
    assert "data.corpus" in str(err.value) and "allowed: stdlib, synthetic" in str(err.value)
    with pytest.raises(ConfigError, match="data.corpus"):
        resolve_corpus([str(tmp_path / "nope.txt")])
    stdlib = resolve_corpus(["stdlib"])
    assert Path(os.__file__).resolve() in stdlib and len(stdlib) > 100
    assert all(p.suffix == ".py" and "site-packages" not in p.parts for p in stdlib)
    assert resolve_corpus(["stdlib"]) == stdlib  # deterministic
    assert resolve_corpus(["synthetic"]) is None
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("a")
    (tmp_path / "d" / "sub" / "b.md").write_text("b")
    assert [p.name for p in resolve_corpus([str(tmp_path / "d")])] == ["a.txt", "b.md"]
    assert [p.name for p in resolve_corpus([str(tmp_path / "d" / "**" / "*.md")])] == ["b.md"]


def test_token_cache_is_built_once_and_reused(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    tokens = load_tokens(cfg)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16 and not tokens.flags.writeable
    files = list((tmp_path / "cache").iterdir())
    assert len(files) == 1
    expected = np.concatenate([np.frombuffer(Path(SMALL[0]).read_bytes(), np.uint8), [EOS],
                               np.frombuffer(Path(SMALL[1]).read_bytes(), np.uint8)])
    assert np.array_equal(tokens, expected)
    mtime = files[0].stat().st_mtime_ns
    time.sleep(0.01)
    again = load_tokens(cfg)
    assert files[0].stat().st_mtime_ns == mtime and np.array_equal(again, tokens)
    # A different cap is a different cache.
    capped = load_tokens(cfg_for(tmp_path, max_corpus_mb=0.01))
    assert len(capped) == int(0.01 * 2**20) and len(list((tmp_path / "cache").iterdir())) == 2


def _load_in_child(cfg: DataConfig, barrier, queue) -> None:
    barrier.wait()  # both children tokenize at the same moment
    queue.put(len(load_tokens(cfg)))


def test_concurrent_cache_creation_gives_one_valid_file(tmp_path: Path) -> None:
    cfg = DataConfig(corpus=["stdlib"], max_corpus_mb=4, cache_dir=str(tmp_path / "cache"))
    ctx = multiprocessing.get_context("fork")  # torch is already imported: fork skips re-importing it
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_load_in_child, args=(cfg, barrier, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    files = list((tmp_path / "cache").iterdir())
    assert len(files) == 1 and files[0].name.endswith(".uint16.bin")  # no temp file left behind
    tokens = load_tokens(cfg)
    assert [queue.get(timeout=5), queue.get(timeout=5)] == [len(tokens)] * 2
    first = resolve_corpus(["stdlib"])[0].read_bytes()
    assert np.array_equal(tokens[:len(first)], np.frombuffer(first, np.uint8))


@pytest.mark.parametrize("objective", ["causal", "blank_infilling"])
def test_batches_are_a_function_of_seed_step_and_micro(tmp_path: Path, objective: str) -> None:
    cfg = cfg_for(tmp_path, objective=objective)
    full = take(build_loader(cfg, batch_size=4, seed=7, accumulation_steps=2), 10)  # steps 0..4
    assert same(full, take(build_loader(cfg, batch_size=4, seed=7, accumulation_steps=2), 10))
    resumed = take(build_loader(cfg, batch_size=4, seed=7, start_step=3, accumulation_steps=2), 4)
    assert same(resumed, full[6:10])
    other = take(build_loader(cfg, batch_size=4, seed=8, accumulation_steps=2), 2)
    assert not torch.equal(other[0]["input_ids"], full[0]["input_ids"])
    assert not torch.equal(full[0]["input_ids"], full[1]["input_ids"])  # micro-batches differ


@pytest.mark.parametrize("objective", ["causal", "blank_infilling"])
def test_rank_slices_concatenate_to_the_single_rank_batch(tmp_path: Path, objective: str) -> None:
    cfg = cfg_for(tmp_path, objective=objective)
    whole = take(build_loader(cfg, batch_size=6, seed=1), 3)
    ranks = [take(build_loader(cfg, batch_size=3, seed=1, rank=r, world_size=2), 3) for r in range(2)]
    for step in range(3):
        for key, value in whole[step].items():
            assert torch.equal(torch.cat([ranks[0][step][key], ranks[1][step][key]]), value)


def test_causal_batch_is_a_text_window_with_aligned_labels(tmp_path: Path) -> None:
    loader = build_loader(cfg_for(tmp_path), batch_size=4, seed=0)
    batch = next(iter(loader))
    x, y = batch["input_ids"], batch["labels"]
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])  # labels[:, t] is the token after input_ids[:, t]
    text = bytes(loader.tokens[loader.tokens < 256].astype(np.uint8))
    assert bytes(x[0][x[0] < 256].tolist()) in text or EOS in x[0]
    assert loader.vocab_size == VOCAB_SIZE


def test_blank_infilling_batch_shapes(tmp_path: Path) -> None:
    batch = next(iter(build_loader(cfg_for(tmp_path, objective="blank_infilling"), batch_size=3, seed=0)))
    assert batch["input_ids"].shape == batch["labels"].shape == (3, 32)
    assert batch["position_ids"].shape == (3, 2, 32)
    assert batch["attention_mask"].shape == (3, 1, 32, 32) and batch["attention_mask"].dtype == torch.bool
    assert ((batch["labels"] != -100).sum(1) > 0).all()


def test_io_delay_slows_loading(tmp_path: Path) -> None:
    def time_three(delay: float) -> float:
        loader = build_loader(cfg_for(tmp_path, io_delay_ms=delay), batch_size=2, seed=0)
        it = iter(loader)
        next(it)  # warm up
        start = time.perf_counter()
        take(it, 3)
        return time.perf_counter() - start

    # The sleeps alone take 0.15 s; the loading around them is too short and noisy to add to it.
    slow, fast = time_three(50.0), time_three(0.0)
    assert slow >= 3 * 0.050 and slow > fast + 2 * 0.050


def test_synthetic_corpus_needs_no_files(tmp_path: Path) -> None:
    cfg = DataConfig(corpus=["synthetic"], cache_dir=str(tmp_path / "cache"), seq_len=16)
    loader = build_loader(cfg, batch_size=4, seed=3)
    batches = take(loader, 2)
    assert loader.tokens is None and not (tmp_path / "cache").exists()
    x = batches[0]["input_ids"]
    assert x.shape == (4, 16) and int(x.max()) < 256
    assert same(batches, take(build_loader(cfg, batch_size=4, seed=3), 2))
    assert not torch.equal(batches[0]["input_ids"], batches[1]["input_ids"])


def test_workers_yield_the_same_batches(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path, objective="blank_infilling")
    main = take(build_loader(cfg, batch_size=4, seed=5), 6)
    options = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": False}
    assert same(main, take(build_loader(cfg, batch_size=4, seed=5, loader_options=options), 6))


def test_dataset_pickles_without_its_tokens(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    dataset = WindowDataset(load_tokens(cfg), cfg)
    blob = pickle.dumps(dataset)
    assert len(blob) < 10_000 < len(dataset.tokens)  # spawned workers reopen the memmap
    clone = pickle.loads(blob)
    assert isinstance(clone.tokens, np.memmap) and torch.equal(clone[(100, 1)], dataset[(100, 1)])


def test_changing_batch_size_changes_later_batches(tmp_path: Path) -> None:
    loader = build_loader(cfg_for(tmp_path), batch_size=4, seed=0, accumulation_steps=2)
    it = iter(loader)
    assert [len(b["input_ids"]) for b in take(it, 2)] == [4, 4]
    loader.sampler.batch_size = 6
    assert [len(b["input_ids"]) for b in take(it, 4)] == [6, 6, 6, 6]


def test_loader_options_that_build_loader_owns_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        build_loader(cfg_for(tmp_path), batch_size=2, seed=0, loader_options={"batch_size": 3})


def test_accumulation_and_ranks_slice_the_same_global_batch() -> None:
    from reference_model.data import StepBatchSampler

    def global_batch(batch: int, accum: int, world: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for micro in range(accum):
            for rank in range(world):
                sampler = StepBatchSampler(num_starts=10_000, batch_size=batch, seed=3,
                                           accumulation_steps=accum, rank=rank, world_size=world)
                out += sampler.items(7, micro)
        return out

    one = global_batch(8, 1, 1)
    assert len(set(one)) == 8
    assert global_batch(2, 4, 1) == one
    assert global_batch(4, 1, 2) == one
    assert global_batch(2, 2, 2) == one
