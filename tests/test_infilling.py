"""GLM blank infilling (shared/reference/glm-spec.md 2) on real text: the stdlib's own source."""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from reference_model.infilling import (
    EOP_ID,
    IGNORE_INDEX,
    MASK_ID,
    PAD_ID,
    SOP_ID,
    build_blank_infilling_sample,
    build_sample_from_spans,
    collate_blank_infilling,
    source_length,
    truncated_poisson_weights,
)

S, E, M = SOP_ID, EOP_ID, MASK_ID


@pytest.fixture(scope="module")
def text() -> np.ndarray:
    """About 200 KiB of real text: random.py's own bytes."""
    return np.frombuffer(Path(random.__file__).read_bytes(), dtype=np.uint8).astype(np.int64)


def test_worked_example_of_the_spec() -> None:
    # x1..x6 = 11..16; spans {x3} and {x5, x6}; Part B order {x5, x6} first.
    x = [11, 12, 13, 14, 15, 16]
    s = build_sample_from_spans(x, [(2, 3), (4, 6)], part_b_order=[1, 0])
    assert s["sep"] == 5
    assert s["input_ids"].tolist() == [11, 12, M, 14, M] + [S, 15, 16, S, 13]
    # The spec's positions are 1-based (GLM-1 had [CLS] at 0); without [CLS] they are those - 1.
    assert s["position_ids"][0].tolist() == [0, 1, 2, 3, 4] + [4, 4, 4, 2, 2]
    assert s["position_ids"][1].tolist() == [0, 0, 0, 0, 0] + [1, 2, 3, 1, 2]
    assert s["labels"].tolist() == [IGNORE_INDEX] * 5 + [15, 16, E, 13, E]


def test_given_spans_must_not_touch() -> None:
    with pytest.raises(ValueError, match="overlap or touch"):
        build_sample_from_spans(list(range(10)), [(1, 3), (3, 4)])


def test_masked_share_and_span_lengths_follow_glm(text: np.ndarray) -> None:
    rng = random.Random(0)
    n, lengths, shares = 200, [], []
    for _ in range(2000):
        start = rng.randrange(len(text) - n)
        s = build_blank_infilling_sample(text[start:start + n], rng)
        spans = s["spans"]
        lengths += [e - b for b, e in spans]
        shares.append(sum(e - b for b, e in spans) / n)
    assert 0.12 <= np.mean(shares) <= 0.20
    w = np.array(truncated_poisson_weights(3.0))
    p = w / w.sum()
    expected_mean = float((np.arange(1, 40) * p).sum())
    assert abs(np.mean(lengths) - expected_mean) < 0.3
    # Chi-square over lengths 1..8 and a tail bin: 8 degrees of freedom, p = 0.001 at 26.1.
    counts = np.bincount(lengths, minlength=41)[1:40]
    obs = np.append(counts[:8], counts[8:].sum())
    exp = np.append(p[:8], p[8:].sum()) * len(lengths)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < 26.1, (chi2, obs, exp.round())


def test_spans_never_touch_and_part_b_decodes_to_them(text: np.ndarray) -> None:
    rng = random.Random(1)
    orders = set()
    for _ in range(300):
        start = rng.randrange(len(text) - 100)
        src = text[start:start + 100]
        s = build_blank_infilling_sample(src, rng)
        spans, sep = s["spans"], s["sep"]
        assert all(a_end < b_start for (_, a_end), (b_start, _) in pairwise(spans))
        assert all(0 <= b < e <= len(src) for b, e in spans)
        assert len(s["input_ids"]) == len(src) + 2 * len(spans)
        # Part B, cut at each [sop], is the spans in the recorded order.
        part_b = s["input_ids"][sep:].tolist()
        cuts = [i for i, t in enumerate(part_b) if t == S] + [len(part_b)]
        pieces = [part_b[a + 1:b] for a, b in pairwise(cuts)]
        assert pieces == [src[spans[i][0]:spans[i][1]].tolist() for i in s["part_b_order"]]
        # Part A is the text with one [MASK] per span.
        part_a = s["input_ids"][:sep].tolist()
        assert part_a.count(M) == len(spans)
        assert [t for t in part_a if t != M] == [t for i, t in enumerate(src.tolist())
                                                 if not any(b <= i < e for b, e in spans)]
        # A span's Part B tokens sit at its [MASK]'s position.
        mask_pos = s["position_ids"][0][:sep][np.array(part_a) == M].tolist()
        b_pos = [s["position_ids"][0][sep + c] for c in cuts[:-1]]
        assert b_pos == [mask_pos[i] for i in s["part_b_order"]]
        orders.add(tuple(s["part_b_order"]) == tuple(sorted(s["part_b_order"])))
    assert orders == {True, False}  # Part B order is shuffled, not always sorted


def test_collated_labels_and_mask(text: np.ndarray) -> None:
    seq_len = 64
    n = source_length(seq_len, 0.15)
    rng = random.Random(2)
    samples = [build_blank_infilling_sample(text[i * n:(i + 1) * n], rng) for i in range(16)]
    batch = collate_blank_infilling(samples, seq_len)
    assert batch["input_ids"].shape == (16, seq_len) and batch["labels"].shape == (16, seq_len)
    assert batch["position_ids"].shape == (16, 2, seq_len)
    mask = batch["attention_mask"]
    assert mask.shape == (16, 1, seq_len, seq_len) and mask.dtype == torch.bool
    for i, s in enumerate(samples):
        sep, length = s["sep"], len(s["input_ids"])
        labels, m = batch["labels"][i], mask[i, 0]
        assert (labels[:sep] == IGNORE_INDEX).all()  # no loss on Part A
        assert (labels[sep:length] != IGNORE_INDEX).all()  # loss on every Part B token
        assert (labels[length:] == IGNORE_INDEX).all() and (batch["input_ids"][i, length:] == PAD_ID).all()
        assert not m[:sep, sep:].any()  # Part A never sees Part B
        assert m[:length, :sep].all()  # everyone sees all of Part A
        part_b = m[sep:length, sep:length]
        assert torch.equal(part_b, torch.ones_like(part_b).tril())  # Part B is causal
        assert not m[:length, length:].any()  # no real token sees padding
        assert m.any(-1).all()  # no empty row: padding rows see position 0
    # Row 0 is usable as HF's additive mask without NaN.
    scores = torch.randn(16, 1, seq_len, seq_len).masked_fill(~mask, float("-inf"))
    assert not scores.softmax(-1).isnan().any()


def test_sample_fits_seq_len_for_every_source_length() -> None:
    for seq_len in (8, 9, 16, 64, 257):
        n = source_length(seq_len, 0.15)
        rng = random.Random(seq_len)
        for _ in range(200):
            s = build_blank_infilling_sample(list(range(n)), rng)
            assert len(s["input_ids"]) <= seq_len and s["spans"]


def test_numpy_generator_works_too(text: np.ndarray) -> None:
    s = build_blank_infilling_sample(text[:100], np.random.default_rng(0))
    again = build_blank_infilling_sample(text[:100], np.random.default_rng(0))
    assert s["spans"] and s["input_ids"].tolist() == again["input_ids"].tolist()
