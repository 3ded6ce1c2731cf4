"""The reference model against HF GlmForCausalLM (fp32 parity), its counts, loss convention and init."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from optimizers.attention_kernels import eager_attention, sdpa_attention
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM

transformers = pytest.importorskip("transformers")
from reference_model import hf  # noqa: E402  (needs transformers)

# tiny shapes covering the GLM-4 quirks: GQA (KV < H), head_dim != hidden / heads, partial RoPE
# at 0.5 / 0.25 / 1.0, both rope_theta values in use, q/k/v bias on and off
CONFIGS = [
    dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
         partial_rotary_factor=0.5, rope_theta=10000.0, attention_bias=True, pad_token_id=0),
    dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=3, head_dim=8,
         partial_rotary_factor=0.25, rope_theta=500000.0, attention_bias=False),
    dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=12,
         partial_rotary_factor=1.0, rope_theta=10000.0, attention_bias=True),
    dict(hidden_size=40, num_attention_heads=8, num_key_value_heads=1, head_dim=16,
         partial_rotary_factor=0.5, rope_theta=500000.0, attention_bias=True, pad_token_id=5),
]
IDS = [f"H{c['num_attention_heads']}-KV{c['num_key_value_heads']}-hd{c['head_dim']}"
       f"-prf{c['partial_rotary_factor']}-theta{int(c['rope_theta'])}-bias{int(c['attention_bias'])}"
       for c in CONFIGS]
TOL = dict(rtol=1e-5, atol=1e-5)


def tiny(**overrides):
    base = dict(vocab_size=96, intermediate_size=56, num_hidden_layers=2)
    return model_config("tiny", **{**base, **overrides})


@torch.no_grad()
def randomize(model: torch.nn.Module) -> None:
    """Weights of order one (norms and biases too), so a wrong term shows in the logits."""
    for name, p in model.named_parameters():
        p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))


def hf_logits(hf_model, ids, mask=None):
    # an explicit mask: without one, HF v5 scans position_ids for packed sequences (spec 1.4)
    mask = torch.ones_like(ids) if mask is None else mask
    return hf_model(input_ids=ids, attention_mask=mask, use_cache=False).logits


@pytest.mark.parametrize("overrides", CONFIGS, ids=IDS)
def test_parity_from_hf(overrides):
    torch.manual_seed(0)
    hf_model = transformers.GlmForCausalLM(hf.to_hf_config(tiny(**overrides), attn_implementation="eager"))
    randomize(hf_model)
    hf_model.eval()
    ours = hf.from_hf(hf_model)
    ids = torch.randint(0, 96, (2, 19))
    torch.testing.assert_close(ours(ids).logits, hf_logits(hf_model, ids), **TOL)
    # the same keys and shapes both ways, and the rotary buffer is not among them
    assert set(ours.state_dict()) == set(hf_model.state_dict())
    assert not any("inv_freq" in key for key in ours.state_dict())
    fresh = GLMForCausalLM(tiny(**overrides))
    fresh.load_state_dict(hf_model.state_dict(), strict=True)
    hf_model.load_state_dict(fresh.state_dict(), strict=True)
    for attention_fn in (eager_attention, sdpa_attention):
        for block in fresh.blocks:
            block.self_attn.attention_fn = attention_fn
        torch.testing.assert_close(fresh(ids).logits, hf_logits(hf_model, ids), **TOL)


@pytest.mark.parametrize("overrides", CONFIGS, ids=IDS)
def test_parity_to_hf(overrides):
    torch.manual_seed(1)
    ours = GLMForCausalLM(tiny(**overrides))
    randomize(ours)
    hf_model = hf.to_hf(ours)
    assert hf_model.config._attn_implementation == "eager"
    ids = torch.randint(0, 96, (3, 23))
    torch.testing.assert_close(ours(ids).logits, hf_logits(hf_model, ids), **TOL)
    # explicit positions, 1D and GLM's 2D (row 0 is used), give the same result as the default
    pos = torch.arange(23).expand(3, 23)
    torch.testing.assert_close(ours(ids, position_ids=pos).logits, ours(ids).logits)
    glm_2d = torch.stack((pos, torch.zeros_like(pos)), dim=1)  # (B, 2, T)
    torch.testing.assert_close(ours(ids, position_ids=glm_2d).logits, ours(ids).logits)
    assert hf.from_hf_config(hf_model.config) == ours.config


def test_config_round_trip_keeps_a_preset_name():
    cfg = model_config("glm4-9b")
    hf_cfg = hf.to_hf_config(cfg)
    assert hf_cfg.tie_word_embeddings is False
    assert hf.from_hf_config(hf_cfg) == cfg
    assert hf.from_hf_config(transformers.GlmConfig()).preset == "glm4-9b"  # HF's defaults are GLM-4-9B


def test_prefix_mask_matches_hf_float_mask():
    """Blank-infilling style: a bidirectional prefix (Part A) then causal (Part B)."""
    torch.manual_seed(2)
    ours = GLMForCausalLM(tiny(**CONFIGS[0]))
    randomize(ours)
    hf_model = hf.to_hf(ours)
    B, T = 2, 15
    ids = torch.randint(0, 96, (B, T))
    prefix = torch.tensor([6, 10])
    q, kv = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (kv <= q) | (kv < prefix[:, None, None])  # (B, T, T)
    mask = allowed[:, None]  # (B, 1, T, T) bool, True = may attend
    additive = torch.zeros(B, 1, T, T).masked_fill(~mask, torch.finfo(torch.float32).min)
    expected = hf_logits(hf_model, ids, additive)
    for attention_fn in (sdpa_attention, eager_attention):
        for block in ours.blocks:
            block.self_attn.attention_fn = attention_fn
        got = ours(ids, attention_mask=mask).logits
        torch.testing.assert_close(got, expected, **TOL)
    assert not torch.allclose(got, ours(ids).logits)  # the prefix mask does change the result
    with pytest.raises(ValueError, match="bool"):
        ours(ids, attention_mask=additive)


def test_glm4_9b_counts_on_meta():
    with torch.device("meta"):
        model = GLMForCausalLM(model_config("glm4-9b"))
    assert model.num_params() == 9_399_951_360
    assert model.num_params(non_embedding=True) == 8_779_194_368
    flops = model.flops_per_token(4096)
    assert flops == 6 * 8_779_194_368 + 12 * 40 * 32 * 128 * 4096
    assert flops == pytest.approx(6.0728e10, rel=1e-4)


def test_flops_count_shared_blocks_per_application():
    model = GLMForCausalLM(model_config("tiny", num_hidden_layers=4))
    params, flops = model.num_params(), model.flops_per_token(64)
    per_block = sum(p.numel() for p in model.blocks[0].parameters())
    for i in range(1, 4):  # ALBERT-style: one block object at every position
        model.blocks[i] = model.blocks[0]
    assert model.num_params() == params - 3 * per_block  # parameters are shared ...
    assert model.flops_per_token(64) == flops  # ... compute is not


def test_loss_uses_aligned_labels():
    torch.manual_seed(3)
    model = GLMForCausalLM(tiny())
    ids = torch.randint(0, 96, (2, 12))
    labels = torch.randint(0, 96, (2, 12))
    labels[0, :4] = -100
    labels[1, 7] = -100
    out = model(ids, labels=labels)
    keep = labels != -100
    by_hand = F.cross_entropy(out.logits.float()[keep], labels[keep])
    torch.testing.assert_close(out.loss, by_hand)
    # HF shifts inside its loss: our aligned labels are its labels moved one to the left
    hf_model = hf.to_hf(model)
    hf_loss = hf_model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, use_cache=False).loss
    shifted = torch.cat((ids[:, 1:], torch.full((2, 1), -100)), dim=1)
    torch.testing.assert_close(model(ids, labels=shifted).loss, hf_loss, **TOL)


def test_init_is_seeded_and_matches_hf_recipe():
    torch.manual_seed(4)
    a = GLMForCausalLM(tiny(pad_token_id=3))
    torch.manual_seed(4)
    b = GLMForCausalLM(tiny(pad_token_id=3))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    torch.manual_seed(5)
    assert not torch.equal(GLMForCausalLM(tiny(pad_token_id=3)).lm_head.weight, a.lm_head.weight)
    assert torch.all(a.model.embed_tokens.weight[3] == 0)
    assert torch.all(a.model.norm.weight == 1)
    assert torch.all(a.blocks[0].self_attn.q_proj.bias == 0)
    assert a.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_one_sgd_step_moves_every_parameter():
    torch.manual_seed(6)
    model = GLMForCausalLM(tiny())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ids = torch.randint(0, 96, (4, 16))
    loss = model(ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), name
