"""Conversion to and from Hugging Face `GlmForCausalLM` (transformers 4.46+ and 5.x).

The state dicts have the same keys and shapes (shared/reference/glm-spec.md 1.2), so weights copy
1:1 with `load_state_dict(strict=True)`; only the configs need mapping. transformers is a dev
dependency, imported inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from reference_model.config import PRESETS, GLMConfig
from reference_model.model import GLMForCausalLM

if TYPE_CHECKING:
    from transformers import GlmConfig, GlmForCausalLM

_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim")
_COPIED_FIELDS = (*_SHAPE_FIELDS, "rms_norm_eps", "attention_bias", "max_position_embeddings",
                  "initializer_range", "pad_token_id")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:
        raise ImportError("reference_model.hf needs transformers: pip install transformers, or the "
                          "project's dev extra (pip install -e '.[dev]')") from err
    return transformers


def to_hf_config(cfg: GLMConfig, **overrides: Any) -> GlmConfig:
    """The HF `GlmConfig` of our config (untied lm_head, silu, no dropout); `overrides` go to it too,
    e.g. `attn_implementation="eager"`."""
    tf = _transformers()
    kwargs: dict[str, Any] = {name: getattr(cfg, name) for name in _COPIED_FIELDS}
    # rope_theta / partial_rotary_factor as kwargs: plain fields in v4, moved into
    # `rope_parameters` by v5's config (which still accepts them this way)
    kwargs.update(rope_theta=cfg.rope_theta, partial_rotary_factor=cfg.partial_rotary_factor,
                  tie_word_embeddings=False, hidden_act="silu", attention_dropout=0.0)
    kwargs.update(overrides)
    return tf.GlmConfig(**kwargs)


def from_hf_config(hf_cfg: GlmConfig) -> GLMConfig:
    """Our config of an HF `GlmConfig`; the preset is the one whose shape matches, else 'tiny'."""
    if getattr(hf_cfg, "model_type", "glm") != "glm":
        raise ValueError(f"expected a GlmConfig (model_type 'glm'), got {hf_cfg.model_type!r}; Glm4 "
                         "adds two norms per layer that this model does not have")
    if getattr(hf_cfg, "hidden_act", "silu") != "silu":
        raise ValueError(f"only hidden_act='silu' is supported, got {hf_cfg.hidden_act!r}")
    if getattr(hf_cfg, "tie_word_embeddings", False):
        raise ValueError("tie_word_embeddings=True is not supported: this model's lm_head is untied")
    rope = dict(getattr(hf_cfg, "rope_parameters", None) or {})  # v5; v4 has plain attributes
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only the default RoPE is supported, got rope_type={rope['rope_type']!r}")
    values = {name: getattr(hf_cfg, name) for name in _COPIED_FIELDS}
    values["rope_theta"] = float(rope.get("rope_theta", getattr(hf_cfg, "rope_theta", 10000.0)))
    values["partial_rotary_factor"] = float(
        rope.get("partial_rotary_factor", getattr(hf_cfg, "partial_rotary_factor", 0.5)))
    if values["head_dim"] is None:
        values["head_dim"] = hf_cfg.hidden_size // hf_cfg.num_attention_heads
    if values["num_key_value_heads"] is None:
        values["num_key_value_heads"] = hf_cfg.num_attention_heads
    shape = {name: values[name] for name in _SHAPE_FIELDS}
    preset = next((name for name, p in PRESETS.items() if p == shape), "tiny")
    return GLMConfig(preset=preset, **values)


def from_hf(hf_model: GlmForCausalLM) -> GLMForCausalLM:
    """Our model with a copy of `hf_model`'s weights, on its device and in its dtype."""
    cfg = from_hf_config(hf_model.config)
    ref = next(hf_model.parameters())
    # built on meta, then allocated once: no random init of a copy we overwrite anyway
    with torch.device("meta"):
        model = GLMForCausalLM(cfg)
    model = model.to_empty(device=ref.device).to(dtype=ref.dtype)
    model.load_state_dict(hf_model.state_dict(), strict=True)
    model.model.rotary_emb.reset_inv_freq()  # non-persistent: load_state_dict does not fill it
    return model


def to_hf(model: GLMForCausalLM) -> GlmForCausalLM:
    """An HF `GlmForCausalLM` (eager attention) with a copy of `model`'s weights."""
    tf = _transformers()
    hf_cfg = to_hf_config(model.config, attn_implementation="eager")
    ref = next(model.parameters())
    hf_model = tf.GlmForCausalLM(hf_cfg).to(device=ref.device, dtype=ref.dtype)
    hf_model.load_state_dict(model.state_dict(), strict=True)
    return hf_model.eval()


__all__ = ["from_hf", "from_hf_config", "to_hf", "to_hf_config"]
