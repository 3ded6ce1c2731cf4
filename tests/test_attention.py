"""The attention switch: the three implementations agree where they should, linear is causal, and
apply_attention / its config check do what they say."""

from __future__ import annotations

import pytest
import torch

from optimizers import SwitchesConfig
from optimizers.attention import OPTIMIZATION, AttentionConfig, _check_objective, apply_attention
from optimizers.attention_kernels import ATTENTION, eager_attention, linear_attention, sdpa_attention
from optimizers.base import TrainSetup
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM
from tests.contexts import context

TOL = dict(rtol=1e-5, atol=1e-5)


def qkv(B=2, H=4, KV=2, T=11, hd=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, hd, generator=g), torch.randn(B, KV, T, hd, generator=g),
            torch.randn(B, KV, T, hd, generator=g))


def naive_linear(q, k, v, eps=1e-6):
    """The formula written out with the full (T, T) matrix: O(T^2), for reference only."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    T = q.shape[-2]
    weights = (phi_q @ phi_k.transpose(-2, -1)) * torch.ones(T, T).tril()  # (B, H, T, T)
    return (weights @ v) / (weights.sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_sdpa_matches_eager(kv_heads):
    q, k, v = qkv(KV=kv_heads)
    scale = 8**-0.5
    torch.testing.assert_close(sdpa_attention(q, k, v, mask=None, scale=scale),
                               eager_attention(q, k, v, mask=None, scale=scale), **TOL)
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(2, 1, 11, 11, generator=g) > 0.5) | torch.eye(11, dtype=torch.bool)  # no empty row
    torch.testing.assert_close(sdpa_attention(q, k, v, mask=mask, scale=scale),
                               eager_attention(q, k, v, mask=mask, scale=scale), **TOL)


def test_eager_gqa_is_repeat_interleave():
    """Query head h reads kv head h // (H // KV), as HF's repeat_kv."""
    q, k, v = qkv(H=4, KV=2)
    full = eager_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), mask=None, scale=0.3)
    torch.testing.assert_close(eager_attention(q, k, v, mask=None, scale=0.3), full)


@pytest.mark.parametrize(("T", "chunk", "kv_heads"), [(37, 8, 2), (37, 64, 4), (16, 16, 1), (5, 2, 2)])
def test_linear_chunked_matches_naive(T, chunk, kv_heads):
    q, k, v = qkv(T=T, KV=kv_heads)
    got = linear_attention(q, k, v, mask=None, scale=1.0, chunk_size=chunk)
    torch.testing.assert_close(got, naive_linear(q, k, v), **TOL)


def test_linear_is_causal():
    q, k, v = qkv(T=20)
    base = linear_attention(q, k, v, mask=None, scale=1.0, chunk_size=6)
    for t in (0, 5, 6, 13, 19):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        q2[:, :, t:] += 1.0
        k2[:, :, t:] -= 1.0
        v2[:, :, t:] *= 3.0
        out = linear_attention(q2, k2, v2, mask=None, scale=1.0, chunk_size=6)
        torch.testing.assert_close(out[:, :, :t], base[:, :, :t], rtol=0, atol=0)
        assert not torch.allclose(out[:, :, t:], base[:, :, t:])


def test_linear_model_is_causal():
    torch.manual_seed(0)
    model = GLMForCausalLM(model_config("tiny"))
    for block in model.blocks:
        block.self_attn.attention_fn = linear_attention
    ids = torch.randint(0, 320, (2, 24))
    base = model(ids).logits
    for t in (1, 9, 23):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % 320
        out = model(changed).logits
        torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=0)
        assert not torch.allclose(out[:, t], base[:, t])


def test_linear_refuses_a_mask():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="causal only"):
        linear_attention(q, k, v, mask=torch.ones(11, 11, dtype=torch.bool), scale=1.0)


def test_linear_keeps_dtype_and_gradients():
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in qkv(T=9))
    out = linear_attention(q, k, v, mask=None, scale=1.0, chunk_size=4)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    out.float().sum().backward()
    assert all(t.grad is not None for t in (q, k, v))


@pytest.mark.parametrize("impl", ["eager", "linear", "sdpa"])
def test_apply_attention_sets_every_block(impl):
    model = GLMForCausalLM(model_config("tiny", num_hidden_layers=3))
    setup = TrainSetup(model=model)
    apply_attention(setup, AttentionConfig(impl=impl), context())
    assert all(block.self_attn.attention_fn is ATTENTION[impl] for block in model.blocks)
    assert any(note.startswith("attention:") and impl in note for note in setup.notes)
    assert OPTIMIZATION.enabled(AttentionConfig(impl=impl)) == (impl != "sdpa")


def test_check_objective():
    linear = SwitchesConfig(attention=AttentionConfig(impl="linear"))
    sdpa = SwitchesConfig(attention=AttentionConfig(impl="sdpa"))
    reason = _check_objective(linear, context(objective="blank_infilling"))
    assert reason and "causal" in reason
    assert _check_objective(linear, context(objective="causal")) is None
    assert _check_objective(sdpa, context(objective="blank_infilling")) is None
    assert _check_objective in OPTIMIZATION.checks
