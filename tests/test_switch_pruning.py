"""FFN pruning: structured really shrinks the matmuls and keeps the kept units' function;
unstructured keeps shapes and holds its zeros through real AdamW steps."""

from __future__ import annotations

from pathlib import Path

import torch

from optimizers import SwitchesConfig, TrainSetup
from optimizers.config import build_section
from optimizers.ffn_pruning import FfnPruningConfig, apply_ffn_pruning, channel_importance
from optimizers.param_sharing import ParamSharingConfig, apply_param_sharing
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.model import GLMForCausalLM
from reference_model.trainer import Trainer
from tests.contexts import context

CFG = model_config("tiny")
I, D = CFG.intermediate_size, CFG.hidden_size  # 172, 64


def model(seed: int = 0) -> GLMForCausalLM:
    torch.manual_seed(seed)
    return GLMForCausalLM(CFG)


def pruned(original: GLMForCausalLM, mode: str, sparsity: float) -> GLMForCausalLM:
    copy = GLMForCausalLM(CFG)
    copy.load_state_dict(original.state_dict())
    apply_ffn_pruning(TrainSetup(model=copy), FfnPruningConfig(mode=mode, sparsity=sparsity), context())
    return copy


def ids() -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))


class Losses(TrainerHook):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_step_end(self, record: StepRecord) -> None:
        self.losses.append(float(record.loss))


def train(tmp_path: Path, pruning: dict, steps: int) -> tuple[Trainer, Losses]:
    """A Trainer on 1 MiB of real text (the stdlib's source): random tokens teach too little in 6 steps."""
    hook = Losses()
    data = DataConfig(corpus=["stdlib"], seq_len=32, max_corpus_mb=1.0, cache_dir=str(tmp_path / "tokens"))
    trainer = Trainer(model_cfg=CFG, data_cfg=data,
                      train_cfg=TrainConfig(batch_size=4, steps=steps, device="cpu"),
                      switches=build_section(SwitchesConfig, {
                          "ffn_pruning": pruning, "lr_schedule": {"warmup_steps": 0}}, "switches"),
                      hooks=[hook], run_dir=tmp_path)
    return trainer, hook


def test_structured_half_halves_the_real_weight_shapes_and_the_ffn_flops() -> None:
    original = model()
    small = pruned(original, "structured", 0.5)
    for block in small.blocks:
        assert block.mlp.gate_up_proj.weight.shape == (2 * (I // 2), D)
        assert block.mlp.down_proj.weight.shape == (D, I // 2)
    ffn = 3 * I * D * CFG.num_hidden_layers  # gate, up, down per block
    assert original.num_params() - small.num_params() == ffn // 2
    assert original.flops_per_token(32) - small.flops_per_token(32) == 6 * (ffn // 2)
    assert small.config.intermediate_size == I  # the config describes the unpruned shape


def test_structured_at_zero_sparsity_is_the_original_function() -> None:
    original = model()
    same = pruned(original, "structured", 0.0)
    torch.testing.assert_close(same(ids()).logits, original(ids()).logits, rtol=0, atol=0)


def test_structured_keeps_the_function_of_the_kept_units() -> None:
    """Zeroing the dropped units' down columns in the original gives the pruned model's outputs
    exactly when gate row j, up row I + j and down column j were kept together."""
    original = model()
    small = pruned(original, "structured", 0.5)
    with torch.no_grad():
        for block in original.blocks:
            keep = channel_importance(block.mlp).topk(I // 2).indices
            dropped = torch.ones(I, dtype=torch.bool)
            dropped[keep] = False
            block.mlp.down_proj.weight[:, dropped] = 0.0
    torch.testing.assert_close(small(ids()).logits, original(ids()).logits, rtol=1e-5, atol=1e-5)


def test_structured_prunes_a_shared_block_once() -> None:
    shared = GLMForCausalLM(model_config("tiny", num_hidden_layers=4))
    setup = TrainSetup(model=shared)
    apply_param_sharing(setup, ParamSharingConfig(mode="all"), context())
    apply_ffn_pruning(setup, FfnPruningConfig(mode="structured", sparsity=0.5), context())
    assert shared.blocks[3].mlp.down_proj.weight.shape == (D, I // 2)  # not pruned 4 times to I/16


def test_structured_model_still_trains(tmp_path: Path) -> None:
    trainer, hook = train(tmp_path, {"mode": "structured", "sparsity": 0.5}, steps=6)
    trainer.fit()
    assert trainer.setup.raw_model.blocks[0].mlp.down_proj.weight.shape == (D, I // 2)
    assert all(torch.isfinite(torch.tensor(hook.losses)))
    assert hook.losses[-1] < hook.losses[0] - 0.3


def test_unstructured_zeros_stay_zero_through_adamw_steps(tmp_path: Path) -> None:
    trainer, hook = train(tmp_path, {"mode": "unstructured", "sparsity": 0.6}, steps=5)
    model = trainer.setup.raw_model
    weights = [w for b in model.blocks for w in (b.mlp.gate_up_proj.weight, b.mlp.down_proj.weight)]
    start = [w.detach().clone() for w in weights]
    trainer.fit()
    optimizer = trainer.setup.optimizer
    assert isinstance(optimizer, torch.optim.AdamW) and len(hook.losses) == 5
    for w, w0 in zip(weights, start, strict=True):
        assert w.shape == w0.shape
        zero = w0 == 0
        assert abs(zero.float().mean().item() - 0.6) < 0.01
        assert torch.all(w[zero] == 0)  # pruned entries never revived
        assert not torch.equal(w[~zero], w0[~zero])  # the kept ones trained
        state = optimizer.state[w]
        assert torch.all(state["exp_avg"][zero] == 0) and torch.all(state["exp_avg_sq"][zero] == 0)
