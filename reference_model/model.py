"""A GLM-4 style decoder, readable top to bottom, whose state dict maps 1:1 onto HF `GlmForCausalLM`.

Pre-norm blocks of RMSNorm -> attention (GQA, partial interleaved RoPE) -> RMSNorm -> SwiGLU MLP,
then a final RMSNorm and an untied lm_head. Module names are exactly HF's, so
`model.load_state_dict(hf_model.state_dict(), strict=True)` works both ways (see reference_model.hf
and shared/reference/glm-spec.md section 1). There is no dropout: GLM-4 has none.

Shapes: B batch, T sequence, d hidden_size, H query heads, KV key/value heads, hd head_dim,
rd rotary_dim (the first rd of each head's hd dims are rotated), I intermediate_size, V vocab_size.

LABELS ARE ALREADY ALIGNED WITH LOGITS: `labels[b, t]` is the target for position t, so the model
never shifts. (HF shifts inside its loss; to get HF's loss, pass `labels[:, 1:]` padded with -100.)
The data pipeline does the shift once, which lets blank infilling put its targets anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from optimizers.attention_kernels import AttentionFn, sdpa_attention
from reference_model.config import GLMConfig

IGNORE_INDEX = -100
"""Label value that the loss skips (padding, the bidirectional Part A of blank infilling)."""

_STAGE_ONLY = "this model is a pipeline stage (keep_stage dropped an end of it): it runs only stage_forward"


@dataclass
class CausalLMOutput:
    logits: Tensor
    """(B, T, V), in the compute dtype."""
    loss: Tensor | None = None
    """Mean cross-entropy over labels != -100, in float32; None when no labels were given."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # the statistics in fp32 even under bf16 (as HF): a mean of squares overflows/underflows in half
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for partial, interleaved (GPT-J style) RoPE; computed once per forward."""

    inv_freq: Tensor
    """(rd/2,) fp32 frequencies, a buffer."""

    def __init__(self, config: GLMConfig) -> None:
        super().__init__()
        self.rotary_dim = config.rotary_dim
        self.theta = config.rope_theta
        # non-persistent: not in the state dict (as HF), rebuilt from the config instead
        self.register_buffer("inv_freq", self._inv_freq(), persistent=False)

    def _inv_freq(self, device: torch.device | None = None) -> Tensor:
        # the exponent divides by rotary_dim, not head_dim: frequencies span only the rotated dims
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.float, device=device) / self.rotary_dim
        return 1.0 / (self.theta**exponent)  # (rd/2,)

    def reset_inv_freq(self) -> None:
        """Recompute the buffer in fp32 (after `to_empty`, which leaves it uninitialized, or a cast)."""
        self.inv_freq = self._inv_freq(self.inv_freq.device)

    def forward(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.float()  # (B, T, rd/2)
        # pair (2i, 2i+1) shares frequency i, so each angle is repeated twice, side by side
        angles = freqs.repeat_interleave(2, dim=-1)  # (B, T, rd)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of the first rd dims of every head; the other dims pass through."""
    rd = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, rd): broadcast over heads
    x_rot, x_pass = x[..., :rd], x[..., rd:]  # (B, h, T, rd), (B, h, T, hd - rd)
    # (a, b) -> (-b, a) per pair; then (a, b) -> (a cos - b sin, b cos + a sin)
    rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: GLMConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        # head_dim is independent of d: q_proj maps d -> H*hd (GLM-4-9B: 4096 -> 32*128)
        self.q_proj = nn.Linear(d, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.num_key_value_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.num_key_value_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=False)  # never a bias, even with attention_bias
        # the attention switch (optimizers.attention) swaps this per block: eager, sdpa or linear
        self.attention_fn: AttentionFn = sdpa_attention

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, KV, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # GQA: the attention function maps query head h to kv head h // (H // KV) itself
        y = self.attention_fn(q, k, v, mask=mask, scale=self.scaling)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, H*hd)
        return self.o_proj(y)  # (B, T, d)


class MLP(nn.Module):
    def __init__(self, config: GLMConfig) -> None:
        super().__init__()
        # gate and up fused in one matmul; the FIRST half of the output is the gate (as HF)
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, I) each
        return self.down_proj(up * F.silu(gate))  # SwiGLU: (B, T, d)


class Block(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GLMConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class GLMModel(nn.Module):
    """Embedding, blocks and final norm: HF's `GlmModel`, the `model.` prefix of every key."""

    def __init__(self, config: GLMConfig) -> None:
        super().__init__()
        # the embedding and the final norm are None on a pipeline stage that keeps neither end (keep_stage)
        self.embed_tokens: nn.Embedding | None = nn.Embedding(config.vocab_size, config.hidden_size,
                                                              padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm: RMSNorm | None = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None,
                attention_mask: Tensor | None) -> Tensor:
        if self.embed_tokens is None or self.norm is None:
            raise RuntimeError(_STAGE_ONLY)
        B, T = input_ids.shape
        x = self.embed_tokens(input_ids)  # (B, T, d); no embedding scaling in GLM-4
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)
        if position_ids.dim() == 3:
            # GLM's 2D positions (B, 2, T) from the blank-infilling collator: row 0 is the position,
            # row 1 the position inside a span. GLM-4 has 1D RoPE and no second position embedding
            # (the original GLM learned one for row 1), so RoPE rotates by row 0 and row 1 is unused
            position_ids = position_ids[:, 0]
        position_ids = position_ids.expand(B, T)  # (B, T); a (T,) arange broadcasts over the batch
        if attention_mask is not None and (attention_mask.dtype != torch.bool or attention_mask.dim() != 4):
            raise ValueError("attention_mask must be None (causal) or a bool (B, 1, T, T) tensor, True = "
                             f"may attend; got {attention_mask.dtype} {tuple(attention_mask.shape)}")
        # cos/sin once per forward, shared by every layer
        cos, sin = self.rotary_emb(position_ids, x.dtype)  # (B, T, rd) each
        for block in self.layers:
            x = block(x, cos, sin, attention_mask)  # positional args: checkpoint wrappers pass them on
        return self.norm(x)  # (B, T, d)


class GLMForCausalLM(nn.Module):
    def __init__(self, config: GLMConfig) -> None:
        super().__init__()
        self.config = config
        self.model = GLMModel(config)
        # untied (GLM-4); None on a pipeline stage that does not end the model (keep_stage)
        self.lm_head: nn.Linear | None = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.init_weights()

    @property
    def blocks(self) -> nn.ModuleList:
        """The optimizers model protocol (optimizers.base.blocks): the decoder layers, in order."""
        return self.model.layers

    @torch.no_grad()
    def init_weights(self, std: float | None = None) -> None:
        """HF's init: Linear and Embedding N(0, std) (initializer_range by default), biases and the
        padding row zero, norm weights one. On the meta device (shape-only models, for counting)
        there is nothing to fill, so it returns at once."""
        if any(p.is_meta for p in self.parameters()):
            return
        std = self.config.initializer_range if std is None else std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, RotaryEmbedding):
                module.reset_inv_freq()

    def forward(self, input_ids: Tensor, *, position_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, labels: Tensor | None = None) -> CausalLMOutput:
        """Logits for every position, and the loss when `labels` are given.

        input_ids: (B, T) token ids.
        position_ids: None (0..T-1), (B, T), or GLM's (B, 2, T) 2D positions (row 0 is used).
        attention_mask: None for causal attention, or a bool (B, 1, T, T) mask, True = may attend
            (blank infilling: Part A bidirectional, Part B causal).
        labels: (B, T), ALREADY ALIGNED: labels[b, t] is the target of position t (no shift here);
            -100 is ignored.
        """
        if self.lm_head is None:
            raise RuntimeError(_STAGE_ONLY)
        x = self.model(input_ids, position_ids, attention_mask)  # (B, T, d)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if labels is not None:
            # fp32 cross-entropy even under bf16 autocast (as HF): log-softmax over V needs the range
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                                   ignore_index=IGNORE_INDEX)
        return CausalLMOutput(logits=logits, loss=loss)

    def keep_stage(self, numbers: list[int]) -> None:
        """Keep only the blocks a pipeline rank runs (optimizers.pipeline), numbered 0..k-1 in the order
        given: with the embedding when block 0 is among them, the final norm and lm_head when the last is."""
        layers = self.model.layers
        self.model.layers = nn.ModuleList(layers[i] for i in numbers)
        if 0 not in numbers:
            self.model.embed_tokens = None
        if len(layers) - 1 not in numbers:
            self.model.norm = self.lm_head = None

    def stage_forward(self, x: Tensor, start: int = 0, stop: int | None = None) -> Tensor:
        """A pipeline stage's forward through kept blocks [start, stop): token ids (B, T) in where the
        stage begins the model (block 0 kept, start 0), hidden states (B, T, d) elsewhere; logits (B, T, V)
        out where it ends the model. Causal attention, positions 0..T-1."""
        inner = self.model
        stop = len(inner.layers) if stop is None else stop
        if start == 0 and inner.embed_tokens is not None:
            x = inner.embed_tokens(x)  # (B, T, d)
        B, T = x.shape[:2]
        cos, sin = inner.rotary_emb(torch.arange(T, device=x.device).expand(B, T), x.dtype)
        for block in inner.layers[start:stop]:
            x = block(x, cos, sin, None)
        if stop == len(inner.layers) and self.lm_head is not None and inner.norm is not None:
            x = self.lm_head(inner.norm(x))  # (B, T, V)
        return x

    def num_params(self, non_embedding: bool = False) -> int:
        """Unique parameters (a shared one counts once); non_embedding drops the input embedding,
        keeping lm_head (untied, it does a matmul per token)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.model.embed_tokens is not None:
            n -= self.model.embed_tokens.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, PaLM (Chowdhery et al. 2022) appendix B, as nanoGPT's
        `estimate_mfu` and torchtitan compute it: 6*N + 12*L*H*Q*T.

        6*N: forward (2) + backward (4) FLOPs per multiply-add of every weight a token passes
        through. N counts each block's parameters once PER APPLICATION (per position in `blocks`):
        with ALBERT-style sharing one block runs at several positions, so the parameters are
        shared but the compute is not. Plus the final norm and lm_head; the embedding lookup does
        no matmul and is left out. 12*L*H*Q*T: the QK^T and AV matmuls, forward and backward, with
        L = len(blocks), H query heads, Q head_dim, T seq_len (no causal discount, no recompute;
        a linear-attention run does different attention work than this term counts).
        """
        n = sum(sum(p.numel() for p in block.parameters()) for block in self.blocks)
        for head in (self.model.norm, self.lm_head):  # absent on a pipeline stage but the last
            n += sum(p.numel() for p in head.parameters()) if head is not None else 0
        return 6.0 * n + self.attention_flops_per_token(seq_len)

    def attention_flops_per_token(self, seq_len: int) -> float:
        """The 12*L*H*Q*T term of `flops_per_token`: the softmax attention's QK^T and AV matmuls,
        the part that grows with the sequence (the diagnosis calls attention long-sequence bound by it)."""
        return 12.0 * len(self.blocks) * self.config.num_attention_heads * self.config.head_dim * seq_len


if TYPE_CHECKING:  # the checker holds the model to the pipeline's protocol (optimizers.pipeline casts to it)
    from optimizers.pipeline_schedule import StagedModel

    def _staged(model: GLMForCausalLM) -> StagedModel:
        return model
