"""The attention implementations the attention switch chooses between (optimizers.attention).

Every function here has the signature `fn(q, k, v, *, mask, scale) -> (B, H, T, hd)` with q
(B, H, T, hd) and k, v (B, KV, T, hd) after RoPE. They do the GQA mapping themselves: query head h
reads key/value head h // (H // KV) (repeat_interleave order, as HF's `repeat_kv`). `mask` is None
for causal attention or a bool tensor broadcastable to (B, H, T, T), True = may attend. They live apart
from the switch's facts so that reading those needs no torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

AttentionFn = Callable[..., Tensor]
"""`fn(q, k, v, *, mask, scale) -> Tensor`, see the module docstring."""

_TORCH_VERSION = tuple(int(part) for part in torch.__version__.split(".")[:2])


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, KV, T, hd) -> (B, KV * n_rep, T, hd), each kv head repeated n_rep times in a row."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def eager_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float) -> Tensor:
    """Plain matmul + softmax + matmul (HF's eager path): materializes the (T, T) scores per head."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)  # (B, H, T, hd)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, T, T)
    if mask is None:
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    # additive mask (as HF): 0 where allowed, the dtype's min where not
    scores = scores + torch.where(mask, 0.0, torch.finfo(scores.dtype).min).to(scores.dtype)
    # softmax in fp32 even for bf16/fp16 inputs: the exp-sum over T loses too much in half precision
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)  # (B, H, T, hd)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float) -> Tensor:
    """torch's fused scaled_dot_product_attention (flash / memory-efficient / math, chosen by torch)."""
    gqa = q.shape[1] != k.shape[1]
    if gqa and _TORCH_VERSION < (2, 5):  # enable_gqa arrived in torch 2.5
        n_rep = q.shape[1] // k.shape[1]
        k, v, gqa = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep), False
    extra = {"enable_gqa": True} if gqa else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                          **extra)  # (B, H, T, hd)


def _elu_feature_map(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0  # phi(x) > 0, so every denominator below is positive


def linear_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, scale: float,
                     chunk_size: int = 64, eps: float = 1e-6) -> Tensor:
    """Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), chunked.

    V'_i = phi(Q_i)^T S_i / (phi(Q_i)^T Z_i + eps), S_i = sum_{j<=i} phi(K_j) V_j^T,
    Z_i = sum_{j<=i} phi(K_j), phi = elu + 1 (idiap/fast-transformers' formula and eps).

    Chunked so that the cost is linear in T: inside a chunk of C tokens a masked (C, C) product,
    across chunks a carried state S (hd, hd) and Z (hd) per kv head. It never builds a (T, T)
    matrix nor a (T, hd, hd) tensor. The cost is O(T * hd^2) per head (O(T * C * hd) more inside
    the chunks), linear in T but NOT O(T * d): it wins over softmax attention only when T >> hd.

    The source document's snippet (000 3.1: a softmax over positions of Q . sum(K), times K^T V
    summed over the value dim) computes no attention at all: every position gets the same vector
    scaled by one scalar, so the query chooses only a scale, there is no feature map, and every
    position sees the future. Its claimed O(L * D) cost is also wrong; K^T V alone is O(L * D^2).

    `scale` is accepted for the common signature and unused: the denominator normalizes, and
    fast-transformers ignores the softmax temperature too. Computed in fp32 (the running sums grow
    with T), returned in q's dtype. Causal only: a `mask` raises ValueError.
    """
    if mask is not None:
        raise ValueError("linear attention is causal only; it cannot take an attention mask "
                         "(use eager or sdpa for prefix / blank-infilling masks)")
    B, H, T, hd = q.shape
    KV = k.shape[1]
    # GQA without copies: S and Z depend only on k and v, so keep them per kv head and group the
    # H // KV query heads that read each one
    qf = _elu_feature_map(q.float()).view(B, KV, H // KV, T, hd)  # (B, KV, G, T, hd)
    kf = _elu_feature_map(k.float())[:, :, None]  # (B, KV, 1, T, hd)
    vf = v.float()[:, :, None]  # (B, KV, 1, T, hd)
    S = q.new_zeros(B, KV, 1, hd, hd, dtype=torch.float32)  # sum of phi(K_j) V_j^T before the chunk
    Z = q.new_zeros(B, KV, 1, 1, hd, dtype=torch.float32)  # sum of phi(K_j) before the chunk
    outs = []
    # split(), not slicing in a loop: the backward of a slice writes a full-length gradient per
    # chunk, which made backward quadratic in T; split's backward concatenates once.
    chunks = zip(qf.split(chunk_size, -2), kf.split(chunk_size, -2), vf.split(chunk_size, -2), strict=True)
    for qc, kc, vc in chunks:  # (.., C, hd)
        C = qc.shape[-2]
        causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        scores = (qc @ kc.transpose(-2, -1)).masked_fill(~causal, 0.0)  # (B, KV, G, C, C)
        num = scores @ vc + qc @ S  # (B, KV, G, C, hd): inside the chunk + everything before it
        den = scores.sum(-1, keepdim=True) + (qc * Z).sum(-1, keepdim=True)  # (B, KV, G, C, 1)
        outs.append(num / (den + eps))
        S = S + kc.transpose(-2, -1) @ vc  # (B, KV, 1, hd, hd)
        Z = Z + kc.sum(-2, keepdim=True)  # (B, KV, 1, 1, hd)
    return torch.cat(outs, dim=-2).view(B, H, T, hd).to(q.dtype)


ATTENTION: dict[str, AttentionFn] = {"eager": eager_attention, "sdpa": sdpa_attention,
                                     "linear": linear_attention}
