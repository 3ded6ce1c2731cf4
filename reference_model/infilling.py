"""GLM blank infilling: one training sample from a text, and the collator that batches them.

This follows THUDM/GLM `blocklm_utils.py` in its "bert" mode (shared/reference/glm-spec.md 2):

1. Span lengths are drawn from Poisson(mean_span) truncated to 1..39 while the masked count is
   below `int(mask_ratio * len(text))`; `sample_spans` places them with at least one unmasked
   token between two spans.
2. Part A is the text with every span replaced by one [MASK]; a token's position is its index
   in Part A (`cumsum` of "not inside a span past its first token", minus 1).
3. Part B holds the spans in SHUFFLED order, each as inputs `[sop] + span` and targets
   `span + [eop]`; all l+1 tokens of a span take the position of its [MASK] and block
   positions 1..l+1.
4. Targets are aligned with the inputs (no shift) and the loss covers Part B only.

Choices where this differs from the 2022 code, on purpose:
- No leading [CLS]. GLM-1 put [CLS] (its ENC token) at index 0, so its positions start at 1
  for the first text token; GLM-4-era models use no such token, so here the first text token
  has position 0 (the spec's worked example, minus 1).
- When the drawn spans cannot be placed (only possible when a long span overshoots on a short
  text), GLM drops the sample; here the lengths are drawn again with the same generator.
- The window is one text: spans may cross a document separator (GLM splits spans per document).
- No `block_mask_prob` ([dBLOCK] corruption of Part B inputs): GLM-Large trains without it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

MASK_ID, SOP_ID, EOP_ID, PAD_ID = 256, 259, 260, 263
"""The byte tokenizer's ids (reference_model.data); repeated here so this module stands alone."""
MAX_SPAN = 39
"""GLM draws span lengths from range(1, 40)."""
IGNORE_INDEX = -100

Rng = random.Random | np.random.Generator


def truncated_poisson_weights(mean: float, max_len: int = MAX_SPAN) -> list[float]:
    """`[poisson.pmf(i, mean) for i in 1..max_len]`, the weights GLM passes to `rng.choices`."""
    return [math.exp(i * math.log(mean) - mean - math.lgamma(i + 1)) for i in range(1, max_len + 1)]


def source_length(seq_len: int, mask_ratio: float) -> int:
    """The longest text n whose sample always fits in seq_len tokens.

    A sample has n + 2*k tokens for k spans (each span: one [MASK] in Part A, one [sop] in
    Part B), and k <= max(1, int(mask_ratio * n)) because every span but the last is drawn while
    fewer than that many tokens are masked.
    """
    n = seq_len
    while n > 2 and n + 2 * max(1, int(mask_ratio * n)) > seq_len:
        n -= 1
    return n


def _choices(rng: Rng, weights: Sequence[float]) -> int:
    if isinstance(rng, np.random.Generator):
        p = np.asarray(weights) / sum(weights)
        return int(rng.choice(len(weights), p=p)) + 1
    return rng.choices(range(1, len(weights) + 1), weights=weights)[0]


def _randrange(rng: Rng, stop: int) -> int:
    return int(rng.integers(stop)) if isinstance(rng, np.random.Generator) else rng.randrange(stop)


def _shuffle(rng: Rng, items: list) -> None:
    if isinstance(rng, np.random.Generator):
        items[:] = [items[i] for i in rng.permutation(len(items))]
    else:
        rng.shuffle(items)


def sample_span_lengths(n: int, rng: Rng, *, mask_ratio: float = 0.15, mean_span: float = 3.0,
                        weights: Sequence[float] | None = None) -> list[int]:
    """Span lengths drawn while fewer than `max(1, int(mask_ratio * n))` tokens are masked.

    GLM's bound is `int(mask_ratio * n)`; the `max(1, ...)` keeps at least one span (a loss
    target) on texts shorter than 1/mask_ratio.
    """
    weights = weights or truncated_poisson_weights(mean_span)
    target = max(1, int(mask_ratio * n))
    lengths: list[int] = []
    while sum(lengths) < target:
        lengths.append(_choices(rng, weights))
    return lengths


def sample_spans(span_lengths: Sequence[int], total_length: int, rng: Rng,
                 offset: int = 0) -> list[tuple[int, int]]:
    """GLM's placement: [start, end) spans in order, at least one free token between two spans."""
    blank_length = total_length - sum(span_lengths)
    m = blank_length - len(span_lengths) + 1
    if m < 0:
        raise ValueError(f"spans of lengths {list(span_lengths)} do not fit in {total_length} tokens")
    places = sorted(_randrange(rng, m + 1) for _ in span_lengths)
    spans = []
    for place, length in zip(places, span_lengths, strict=True):
        start = offset + place
        spans.append((start, start + length))
        offset += length + 1
    return spans


def build_sample_from_spans(tokens: np.ndarray | Sequence[int], spans: Sequence[tuple[int, int]],
                            part_b_order: Sequence[int] | None = None) -> dict[str, Any]:
    """One sample from given [start, end) spans; `part_b_order` indexes the sorted spans.

    Returns numpy int64 arrays `input_ids` (len(A)+len(B)), `labels` (-100 on Part A),
    `position_ids` (2, len): row 0 positions, row 1 block positions; and `sep` = len(Part A),
    `spans` (sorted) and `part_b_order`.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    spans = sorted((int(s), int(e)) for s, e in spans)
    for (_, end), (start, _) in pairwise(spans):
        if start <= end:
            raise ValueError(f"spans {spans} overlap or touch")
    order = list(range(len(spans))) if part_b_order is None else list(part_b_order)
    if sorted(order) != list(range(len(spans))):
        raise ValueError(f"part_b_order {order} is not a permutation of the {len(spans)} spans")

    # Each span collapses to one slot in Part A, so later tokens shift left.
    keep = np.ones(len(tokens), dtype=np.int64)
    for start, end in spans:
        keep[start + 1:end] = 0
    position = np.cumsum(keep) - 1

    a_ids: list[ArrayLike] = []  # slices of tokens and positions, each span's one-id slot between them
    a_pos: list[ArrayLike] = []
    last = 0
    for start, end in spans:
        a_ids += [tokens[last:start], [MASK_ID]]
        a_pos += [position[last:start], [position[start]]]
        last = end
    a_ids.append(tokens[last:])
    a_pos.append(position[last:])
    a_ids_arr = np.concatenate(a_ids).astype(np.int64)
    sep = len(a_ids_arr)

    b_ids: list[ArrayLike] = []
    b_tgt: list[ArrayLike] = []
    b_pos: list[ArrayLike] = []
    b_block: list[ArrayLike] = []
    for i in order:
        start, end = spans[i]
        span = tokens[start:end]
        b_ids += [[SOP_ID], span]
        b_tgt += [span, [EOP_ID]]
        b_pos.append(np.full(end - start + 1, position[start]))
        b_block.append(np.arange(1, end - start + 2))

    def cat(parts: list[ArrayLike]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    b_ids_arr = cat(b_ids)
    return {
        "input_ids": np.concatenate([a_ids_arr, b_ids_arr]),
        "labels": np.concatenate([np.full(sep, IGNORE_INDEX), cat(b_tgt)]),
        "position_ids": np.stack([np.concatenate([cat(a_pos), cat(b_pos)]),
                                  np.concatenate([np.zeros(sep, np.int64), cat(b_block)])]),
        "sep": sep,
        "spans": spans,
        "part_b_order": order,
    }


def build_blank_infilling_sample(tokens: np.ndarray | Sequence[int], rng: Rng, *,
                                 mask_ratio: float = 0.15, mean_span: float = 3.0) -> dict[str, Any]:
    """A GLM blank-infilling sample of `tokens` (see the module docstring and build_sample_from_spans).

    `rng` is a `random.Random` (GLM's own calls: choices, randrange, shuffle) or a numpy Generator.
    The sample has len(tokens) + 2 * len(spans) tokens; `source_length` says how long a text
    may be so that this fits a sequence length.
    """
    n = len(tokens)
    if n < 2:
        raise ValueError(f"need at least 2 tokens to mask a span, got {n}")
    weights = truncated_poisson_weights(mean_span)
    while True:
        lengths = sample_span_lengths(n, rng, mask_ratio=mask_ratio, weights=weights)
        if n - sum(lengths) - len(lengths) + 1 >= 0:
            break  # placeable; GLM drops the others, we redraw
    _shuffle(rng, lengths)  # as generate_blank_data: which length goes where is random
    spans = sample_spans(lengths, n, rng)
    order = list(range(len(spans)))
    _shuffle(rng, order)
    return build_sample_from_spans(tokens, spans, order)


def blank_infilling_mask(seps: torch.Tensor, lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(B, 1, L, L) bool, True = may attend, from GLM's `m = tril(ones); m[:, :sep] = 1`.

    Every real token sees all of Part A; Part B is causal over itself; Part A never sees Part B.
    Padding keys are seen by no real query; a padding query sees position 0 only, so no row is
    empty (an all-False row would make softmax NaN).
    """
    q = torch.arange(seq_len).view(1, -1)  # (1, L)
    # Query q may see keys k < max(q + 1, sep): that is tril | m[:, :sep]. The bound never passes
    # the sample's length, so real queries never see padding; padding queries get bound 1.
    bound = torch.maximum(q + 1, seps.view(-1, 1))  # (B, L)
    bound = torch.where(q < lengths.view(-1, 1), bound, 1)
    mask = torch.arange(seq_len).view(1, 1, -1) < bound.unsqueeze(-1)  # (B, L, L)
    return mask.unsqueeze(1)


def collate_blank_infilling(samples: Sequence[dict[str, Any]], seq_len: int) -> dict[str, torch.Tensor]:
    """Right-pad samples to seq_len: input_ids (B,L) with [pad], labels (B,L) with -100,
    position_ids (B,2,L) with 0, attention_mask bool (B,1,L,L) (blank_infilling_mask)."""
    bsz = len(samples)
    input_ids = torch.full((bsz, seq_len), PAD_ID, dtype=torch.long)
    labels = torch.full((bsz, seq_len), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((bsz, 2, seq_len), dtype=torch.long)
    seps = torch.empty(bsz, dtype=torch.long)
    lengths = torch.empty(bsz, dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        if n > seq_len:
            raise ValueError(f"sample {i} has {n} tokens, more than seq_len={seq_len}")
        input_ids[i, :n] = torch.as_tensor(s["input_ids"])
        labels[i, :n] = torch.as_tensor(s["labels"])
        position_ids[i, :, :n] = torch.as_tensor(s["position_ids"])
        seps[i], lengths[i] = s["sep"], n
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids,
            "attention_mask": blank_infilling_mask(seps, lengths, seq_len)}
