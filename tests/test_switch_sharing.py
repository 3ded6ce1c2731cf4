"""ALBERT-style parameter sharing: fewer parameters, same compute, gradients summed over applications."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch

from optimizers import SwitchesConfig, TrainSetup
from optimizers.config import build_section
from optimizers.param_sharing import ParamSharingConfig, apply_param_sharing, owners
from reference_model.config import DataConfig, TrainConfig, model_config
from reference_model.hooks import StepRecord, TrainerHook
from reference_model.model import GLMForCausalLM
from reference_model.trainer import Trainer
from tests.contexts import context

CFG = model_config("tiny", num_hidden_layers=4)


def shared_model(mode: str, group_size: int = 2, seed: int = 0) -> GLMForCausalLM:
    torch.manual_seed(seed)
    model = GLMForCausalLM(CFG)
    apply_param_sharing(TrainSetup(model=model), ParamSharingConfig(mode=mode, group_size=group_size),
                        context())
    return model


def batch(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))


def block_params(model: GLMForCausalLM) -> int:
    return sum(p.numel() for p in model.blocks.parameters())


def test_all_uses_block_zero_everywhere_and_counts_it_once() -> None:
    plain = GLMForCausalLM(CFG)
    one_block = sum(p.numel() for p in plain.blocks[0].parameters())
    model = shared_model("all")
    assert all(block is model.blocks[0] for block in model.blocks)
    assert block_params(model) == one_block
    assert model.num_params() == plain.num_params() - 3 * one_block
    # parameters are shared, compute is not: FLOPs per token count every application
    assert model.flops_per_token(64) == plain.flops_per_token(64)


def test_groups_of_two_on_four_layers_gives_two_distinct_blocks() -> None:
    model = shared_model("groups", group_size=2)
    layers = model.blocks
    assert layers[0] is layers[1] and layers[2] is layers[3] and layers[0] is not layers[2]
    assert len({id(b) for b in layers}) == 2
    assert block_params(model) == 2 * sum(p.numel() for p in layers[0].parameters())


def test_a_group_size_that_does_not_divide_the_layers_leaves_a_shorter_last_group() -> None:
    assert owners(4, "groups", 3) == [0, 0, 0, 3]
    assert owners(6, "groups", 4) == [0, 0, 0, 0, 4, 4]
    assert owners(4, "groups", 8) == owners(4, "all", 8) == [0, 0, 0, 0]


def test_gradient_of_a_shared_weight_is_the_sum_over_its_applications() -> None:
    model = shared_model("all")
    # the same function unshared: four independent copies of block 0
    unshared = copy.deepcopy(model)
    for i in range(len(unshared.blocks)):
        unshared.blocks[i] = copy.deepcopy(unshared.blocks[0])
    ids = batch()
    model(ids, labels=ids).loss.backward()
    unshared(ids, labels=ids).loss.backward()
    for name, p in model.blocks[0].named_parameters():
        per_layer = [dict(b.named_parameters())[name].grad for b in unshared.blocks]
        torch.testing.assert_close(p.grad, torch.stack(per_layer).sum(0), rtol=1e-4, atol=1e-6)
    weight = model.blocks[0].mlp.down_proj.weight
    assert weight.grad.abs().sum() > 0
    before = weight.detach().clone()
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    assert not torch.equal(weight, before)
    assert all(block is model.blocks[0] for block in model.blocks)


def test_state_dict_round_trip_keeps_values_and_sharing() -> None:
    model = shared_model("groups", group_size=2, seed=0)
    state = model.state_dict()
    key = "model.layers.{}.mlp.down_proj.weight"
    assert state[key.format(0)].data_ptr() == state[key.format(1)].data_ptr()  # duplicate keys, one tensor
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    other = shared_model("groups", group_size=2, seed=1)
    other.load_state_dict(loaded, strict=True)
    ids = batch()
    torch.testing.assert_close(other(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert other.blocks[0] is other.blocks[1] and other.blocks[2] is other.blocks[3]


def test_loading_an_unshared_state_dict_into_a_shared_model_is_refused() -> None:
    unshared = GLMForCausalLM(CFG).state_dict()  # four different layers, e.g. from Hugging Face
    with pytest.raises(RuntimeError, match="param_sharing: layer 1 shares block 0"):
        shared_model("all").load_state_dict(unshared)


class Losses(TrainerHook):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_step_end(self, record: StepRecord) -> None:
        self.losses.append(float(record.loss))


def test_trainer_resumes_a_shared_model_exactly(tmp_path: Path) -> None:
    def run(steps: int, ckpt_dir: Path, resume: bool) -> tuple[Trainer, list[float]]:
        hook = Losses()
        switches = build_section(SwitchesConfig, {"param_sharing": "all", "checkpoint": {
            "every": 2, "dir": str(ckpt_dir), "resume": resume}}, "switches")
        trainer = Trainer(model_cfg=CFG, data_cfg=DataConfig(corpus=["synthetic"], seq_len=32),
                          train_cfg=TrainConfig(batch_size=4, steps=steps, device="cpu"),
                          switches=switches, hooks=[hook], run_dir=tmp_path)
        trainer.fit()
        return trainer, hook.losses

    full, full_losses = run(4, tmp_path / "full", resume=False)
    assert full.setup.raw_model.num_params() < GLMForCausalLM(CFG).num_params()
    run(2, tmp_path / "split", resume=False)  # saves the shared model's duplicate keys at step 2
    resumed, resumed_losses = run(4, tmp_path / "split", resume=True)
    assert resumed.start_step == 2
    assert resumed_losses == pytest.approx(full_losses[2:], rel=1e-6)
    assert all(b is resumed.setup.raw_model.blocks[0] for b in resumed.setup.raw_model.blocks)
