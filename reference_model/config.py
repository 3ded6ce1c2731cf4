"""Model, data and training config sections, and the named model presets (one table).

`GLMConfig` mirrors Hugging Face `GlmConfig` field for field (shared/reference/glm-spec.md 1.1),
so a GLM checkpoint's config maps onto it directly; only the defaults of the presets differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from optimizers.config import MAX_BATCH, ConfigError, Section, build_section

BYTE_VOCAB = 256
"""The byte-level tokenizer's ordinary tokens; GLM's special tokens follow (reference_model.data)."""


SHAPE_LIMITS: dict[str, int] = {
    "vocab_size": 2**22, "hidden_size": 2**17, "intermediate_size": 2**19, "num_hidden_layers": 1024,
    "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 2**12, "max_position_embeddings": 2**24,
}
"""The largest value of each shape field: beyond every published model by a wide margin, and small enough that
`glmperf plan` can build the model on the meta device and trace it without its sizes leaving 64 bits."""


@dataclass
class GLMConfig(Section):
    """A GLM-4 style decoder (HF `GlmForCausalLM`): RMSNorm, partial interleaved RoPE, GQA, SwiGLU."""

    KEY: ClassVar[str] = "model"
    preset: str = "tiny"
    """Named shape from PRESETS; the fields below override single values of it."""
    vocab_size: int = 320
    hidden_size: int = 64
    intermediate_size: int = 172
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    """Independent of hidden_size: q_proj outputs num_attention_heads * head_dim."""
    partial_rotary_factor: float = 0.5
    """Share of each head's dims that RoPE rotates (the first ones, interleaved pairs)."""
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1.5625e-07
    attention_bias: bool = True
    """Bias on q/k/v only; o_proj never has one."""
    max_position_embeddings: int = 131072
    initializer_range: float = 0.02
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        self.check_choice("preset", PRESETS)
        for name, most in SHAPE_LIMITS.items():
            self.check_range(name, lo=1, hi=most)
        self.check_range("partial_rotary_factor", lo=0.0, hi=1.0)
        self.check_range("rope_theta", lo=0.0, hi=1e10, lo_open=True)
        self.check_range("rms_norm_eps", lo=0.0, hi=1.0, lo_open=True)
        self.check_range("initializer_range", lo=0.0, hi=1.0)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(self.key("num_key_value_heads"),
                              f"{self.num_key_value_heads} does not divide num_attention_heads="
                              f"{self.num_attention_heads}; allowed: a divisor of it")
        if self.rotary_dim % 2:
            raise ConfigError(self.key("partial_rotary_factor"),
                              f"head_dim * partial_rotary_factor = {self.rotary_dim} must be even "
                              "(RoPE rotates pairs)")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(self.key("pad_token_id"), f"got {self.pad_token_id}; allowed: "
                              f"None or 0..{self.vocab_size - 1}")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)


# Named shapes. `tiny` is for CI (a step well under a second on 2 cores), `small` for the CPU demo,
# the rest are GPU-shaped; build those on the meta device to count parameters and FLOPs for free.
# Vocab 320 = the byte tokenizer's 264 tokens padded to a multiple of 64 (faster matmuls, nanoGPT).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=320, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "small": dict(vocab_size=320, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "glm-350m": dict(vocab_size=151552, hidden_size=1024, intermediate_size=2816,
                     num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=2, head_dim=64),
    "glm-1.5b": dict(vocab_size=151552, hidden_size=2048, intermediate_size=5632,
                     num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=2, head_dim=128),
    # GLM-4-9B, the HF GlmConfig defaults: 9,399,951,360 parameters.
    "glm4-9b": dict(vocab_size=151552, hidden_size=4096, intermediate_size=13696,
                    num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=2, head_dim=128),
}

_SHAPE_FIELDS = {k for preset in PRESETS.values() for k in preset}


def model_config(preset: str = "tiny", **overrides: Any) -> GLMConfig:
    """A preset's config with single fields overridden (`model_config('small', num_hidden_layers=2)`)."""
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError("model.preset", f"got {preset!r}; allowed: {', '.join(PRESETS)}")
    config: GLMConfig = build_section(GLMConfig, {"preset": preset, **PRESETS[preset], **overrides}, "model")
    return config


def resolve_model_section(data: dict[str, Any] | None) -> GLMConfig:
    """Build the `model` section from YAML/CLI data: the preset first, then single fields."""
    data = dict(data or {})
    preset = data.pop("preset", "tiny")
    return model_config(preset, **data)


@dataclass
class DataConfig(Section):
    KEY: ClassVar[str] = "data"
    corpus: list[str] = field(default_factory=lambda: ["stdlib"])
    """stdlib (the Python standard library's source, on every machine), synthetic (random tokens,
    for pure speed runs), or text files / globs."""
    seq_len: int = 64
    objective: str = "causal"
    """causal (next-token LM) or blank_infilling (GLM: spans masked in Part A, generated in Part B)."""
    io_delay_ms: float = 0.0
    """Extra latency per batch in the loader, to induce an input bottleneck on purpose."""
    max_corpus_mb: float = 64.0
    """Stop reading the corpus after this many MiB of text (keeps the first tokenization short)."""
    cache_dir: str = ""
    """Where token caches live ('' = ~/.cache/glmperf/tokens or $GLMPERF_CACHE)."""
    mask_ratio: float = 0.15
    """blank_infilling: share of tokens masked into spans."""
    mean_span: float = 3.0
    """blank_infilling: Poisson mean of span lengths."""

    def __post_init__(self) -> None:
        if isinstance(self.corpus, str):
            self.corpus = [self.corpus]
        if not self.corpus:
            raise ConfigError(self.key("corpus"), "empty; allowed: stdlib, synthetic, or text file paths/globs")
        self.check_range("seq_len", lo=8, hi=2**20)
        self.check_choice("objective", ["causal", "blank_infilling"])
        self.check_range("io_delay_ms", lo=0.0, hi=60_000.0)
        self.check_range("max_corpus_mb", lo=0.0, hi=2.0**20, lo_open=True)
        self.check_range("mask_ratio", lo=0.0, hi=0.5, lo_open=True)
        self.check_range("mean_span", lo=0.0, hi=float(self.seq_len), lo_open=True)


@dataclass
class TrainConfig(Section):
    KEY: ClassVar[str] = "train"
    batch_size: int = 8
    """Samples per micro-batch (per rank)."""
    steps: int = 20
    """Optimizer steps."""
    lr: float = 3e-3
    """Peak learning rate (after warmup)."""
    seed: int = 0
    device: str = "auto"
    """auto (cuda if available, else cpu), cpu, cuda, or cuda:N."""
    log_every: int = 10

    def __post_init__(self) -> None:
        self.check_range("batch_size", lo=1, hi=MAX_BATCH)
        self.check_range("steps", lo=1, hi=10**9)
        # up to absurd on purpose: a learning rate of 1000 is how the diagnosis scenarios make a run diverge
        self.check_range("lr", lo=0.0, hi=1e6, lo_open=True)
        self.check_range("seed", lo=0, hi=2**63 - 1)
        self.check_range("log_every", lo=1, hi=10**9)
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(self.key("device"), f"got {self.device!r}; allowed: auto, cpu, cuda, cuda:N")
