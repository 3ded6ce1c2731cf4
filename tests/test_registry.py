"""The switch registry and apply_all: nothing, each known name, unknown names, conflicts; the derived
`switches` config; the vocabularies a switch's facts are checked against."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

import optimizers.config
from optimizers import (
    REGISTRY,
    Bottleneck,
    Candidate,
    Capability,
    ConfigError,
    Effect,
    SetupContext,
    SwitchesConfig,
    apply_all,
    check_all,
)
from optimizers.base import Optimization, Registry
from optimizers.config import Section, build_section
from optimizers.facts import METRICS, PHASES, RISKS
from reference_model.config import model_config
from reference_model.model import GLMForCausalLM
from tests.contexts import context

# One non-baseline value per switch that runs on one CPU process.
ENABLED = {
    "amp": "bf16", "activation_checkpointing": "full", "grad_accumulation": 2, "compile": "default",
    "attention": "eager", "param_sharing": "all", "ffn_pruning": "structured", "optimizer": "sgd",
    "lr_schedule": "step", "dataloader": 1, "dynamic_batch": "latency", "stability": {"clip_grad_norm": 0.5},
    "init": "xavier", "checkpoint": 5, "threads": 1,
}
NEEDS_OTHER_CONTEXT = {"ddp": "several ranks", "memory_fraction": "CUDA", "parallel": "several ranks"}


def model() -> GLMForCausalLM:
    torch.manual_seed(0)
    return GLMForCausalLM(model_config("tiny", num_hidden_layers=4))


def test_every_catalog_switch_is_registered_once_in_pipeline_order() -> None:
    names = REGISTRY.names()
    # the order the catalog documents: sharing before checkpointing before compile before DDP
    assert names.index("param_sharing") < names.index("activation_checkpointing") < names.index("compile") \
        < names.index("ddp") < names.index("optimizer")
    assert set(ENABLED) | set(NEEDS_OTHER_CONTEXT) == set(names)


def test_switches_config_is_derived_from_the_registry() -> None:
    fields = dataclasses.fields(SwitchesConfig)
    assert [f.name for f in fields] == REGISTRY.names()
    for f, opt in zip(fields, REGISTRY, strict=True):
        assert f.type is opt.config and f.default_factory() == opt.config()
    assert issubclass(SwitchesConfig, Section) and SwitchesConfig.KEY == "switches"
    assert SwitchesConfig().amp.key("dtype") == "switches.amp.dtype"
    changed = build_section(SwitchesConfig, {"amp": "bf16", "checkpoint": {"every": 5}}, "switches")
    assert pickle.loads(pickle.dumps(changed)) == changed  # configs travel to ranks and workers


def test_each_section_lives_in_its_switch_module() -> None:
    for opt in REGISTRY:
        assert opt.config.__module__ == opt.apply.__module__, opt.name
        assert f"switches.{opt.name}" == opt.config.KEY
    generic = [v for v in vars(optimizers.config).values() if isinstance(v, type) and issubclass(v, Section)]
    assert generic == [Section]


def test_applying_nothing_gives_the_plain_baseline() -> None:
    m = model()
    setup = apply_all(m, SwitchesConfig(), context())
    assert setup.applied == []
    assert setup.model is m and isinstance(setup.optimizer, torch.optim.AdamW)
    assert setup.scheduler is not None  # cosine, applied at its defaults (always=True)
    assert setup.autocast_dtype is None and setup.scaler is None and setup.accumulation_steps == 1
    assert setup.clip_grad_norm == 1.0


@pytest.mark.parametrize("name", sorted(ENABLED))
def test_each_known_switch_applies_and_says_what_it_did(name: str) -> None:
    switches = build_section(SwitchesConfig, {name: ENABLED[name]}, "switches")
    assert REGISTRY.get(name).enabled(getattr(switches, name))
    threads = torch.get_num_threads()
    try:
        setup = apply_all(model(), switches, context())
    finally:
        torch.set_num_threads(threads)  # the threads switch sets the process's
    assert name in setup.applied
    assert any(note.startswith(f"{name}:") for note in setup.notes)


def test_an_unknown_name_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        REGISTRY.get("fp8")
    assert err.value.key == "switches.fp8" and "amp" in str(err.value) and "ddp" in str(err.value)
    with pytest.raises(ConfigError, match=f"allowed: {', '.join(REGISTRY.names())}$"):
        build_section(SwitchesConfig, {"fp8": "on"}, "switches")


def test_a_duplicate_registration_is_refused() -> None:
    registry = Registry()
    registry.register(REGISTRY.get("amp"))
    with pytest.raises(ValueError, match="twice"):
        registry.register(REGISTRY.get("amp"))
    stray = dataclasses.replace(REGISTRY.get("amp"), name="warp_drive")
    assert isinstance(stray, Optimization)
    with pytest.raises(ValueError, match="no section"):
        registry.register(stray)


def test_facts_outside_the_vocabularies_are_refused_naming_the_switch() -> None:
    amp = REGISTRY.get("amp")
    with pytest.raises(ValueError, match=r"'amp' addresses 'communication_bound'.*known: .*comm_bound"):
        Registry().register(dataclasses.replace(amp, addresses=(Bottleneck.COMPUTE_BOUND, "communication_bound")))
    needs_gpu = Candidate(set={"switches.amp.dtype": "bf16"}, effects=(), requires=("gpu",))
    with pytest.raises(ValueError, match=r"'amp' requires 'gpu'.*known: .*cuda"):
        Registry().register(dataclasses.replace(amp, candidates=(needs_gpu,)))
    Registry().register(dataclasses.replace(amp, addresses=("memory_bound",)))  # a plain string is a member


def test_the_bottleneck_kinds_the_diagnosis_fires() -> None:
    assert [b.value for b in Bottleneck] == [
        "input_bound", "host_bound", "memory_bound", "comm_bound", "optimizer_bound", "attention_bound",
        "low_precision_unused", "precision_emulated", "compute_bound", "unstable", "checkpoint_bound",
        "straggler", "cpu_oversubscribed", "throttled", "recompiling"]
    assert all(b.description and str(b) == b.value == b for b in Bottleneck)
    addressed = {kind for opt in REGISTRY for kind in opt.addresses}
    assert {"input_bound", "comm_bound", "checkpoint_bound", "unstable"} <= addressed


@pytest.mark.parametrize(("switches", "ctx", "key", "reason"), [
    ({"attention": "linear"}, context(objective="blank_infilling"), "switches.attention", "causal"),
    ({"ddp": "powersgd"}, context(world_size=1), "switches.ddp", "several ranks"),
    ({"ddp": {"backend": "nccl"}}, context(world_size=2), "switches.ddp", "CUDA"),
    ({"memory_fraction": 0.5}, context(), "switches.memory_fraction", "cpu"),
    ({"optimizer": {"name": "rmsprop", "impl": "fused"}}, context(), "switches.optimizer", "fused"),
])
def test_combinations_that_cannot_run_are_refused_with_the_reason(switches: dict, ctx: SetupContext,
                                                                  key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_all(build_section(SwitchesConfig, switches, "switches"), ctx)
    assert err.value.key == key and reason in str(err.value)


# --------------------------------------------------------------------------------------------
# Effects and candidates: the machine-readable facts a recommender computes gains from


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"target": "gpu_time"}, "target 'gpu_time'"),
    ({"change": "halves"}, "change 'halves'"),
    ({"low": 0.5, "high": 0.2}, "must be ordered"),
    ({"low": -0.1}, "must be ordered"),
    ({"high": 1.5}, r"within \[0, 1\]"),  # a target cannot shrink by more than all of it
    ({"scales_with": "vibes"}, "scales_with 'vibes'"),
])
def test_an_effect_outside_its_bounds_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Effect(**{"target": "forward", "change": "shrinks", "low": 0.1, "high": 0.2, **kwargs})


def test_effect_fractions_follow_their_measured_figure() -> None:
    assert Effect("data", "shrinks", 0.8, 1.0).fraction({}) == (0.8, 1.0)
    assert Effect("backward", "grows", 0.3, 1.4).fraction({}) == (0.3, 1.4)  # growth is unbounded
    # a 0.5..0.8 matmul share at a 4x speed-up loses 3/4 of its time
    matmul = Effect("forward", "shrinks", 0.5, 0.8, scales_with="bf16_matmul_speedup")
    assert matmul.fraction({"bf16_matmul_speedup": 4.0}) == pytest.approx((0.375, 0.6))
    assert matmul.fraction({"bf16_matmul_speedup": 0.5})[1] < 0  # emulated: the target grows
    attention = Effect("forward", "shrinks", 0.25, 0.9, scales_with="attention_share")
    assert attention.fraction({"attention_share": 0.4}) == pytest.approx((0.1, 0.36))
    with pytest.raises(KeyError):
        attention.fraction({})


def test_a_candidate_resolves_its_values_from_the_current_config() -> None:
    candidate = Candidate(set={"switches.checkpoint.every": lambda every: every * 4, "switches.checkpoint.keep": 2},
                          effects=(Effect("checkpoint", "shrinks", 0.75, 0.75),), applies=lambda c: c.every > 0)
    assert candidate.resolve({"switches.checkpoint.every": 25}.__getitem__) == \
        {"switches.checkpoint.every": 100, "switches.checkpoint.keep": 2}
    assert candidate.applies(REGISTRY.get("checkpoint").config(every=5))
    assert not candidate.applies(REGISTRY.get("checkpoint").config())
    with pytest.raises(ValueError, match="risk 'maybe'"):
        Candidate(set={"switches.amp.dtype": "bf16"}, effects=(), risk="maybe")
    with pytest.raises(ValueError, match="at least one"):
        Candidate(set={}, effects=())


def test_every_effect_of_the_catalog_targets_a_known_figure_and_says_why() -> None:
    targets: set[str] = set()
    for opt in REGISTRY:
        for candidate in opt.candidates:
            assert candidate.risk in RISKS and all(key.count(".") >= 1 for key in candidate.set)
            for effect in candidate.effects:
                targets.add(effect.target)
                assert effect.target in PHASES + METRICS, (opt.name, effect)
                cap = 1.0 if effect.change == "shrinks" or effect.scales_with.endswith("_speedup") else 10.0
                assert 0.0 <= effect.low <= effect.high <= cap, (opt.name, effect)
                assert effect.basis, (opt.name, effect.target)
    assert targets - set(PHASES) == set(METRICS)  # every metric name is used; report them to the profiler


def test_switches_propose_what_they_measured_to_pay_off() -> None:
    without = {opt.name for opt in REGISTRY if not opt.candidates}
    assert without == {"init", "memory_fraction"}
    pruning = REGISTRY.get("ffn_pruning").candidates
    assert [c.set["switches.ffn_pruning.mode"] for c in pruning] == ["structured"]  # unstructured: +1% step time
    amp = {c.set["switches.amp.dtype"]: c for c in REGISTRY.get("amp").candidates}
    assert amp["bf16"].requires == (Capability.FAST_BF16_MATMUL,) and amp["bf16"].risk == "numerics"
    assert Capability.FP16_OVER_BF16 in amp["fp16"].requires  # never fp16's GradScaler where bf16 does as well
    assert {e.scales_with for e in amp["bf16"].effects if e.target in ("forward", "backward")} == \
        {"bf16_matmul_speedup"}
    for opt_name in ("param_sharing", "ffn_pruning"):
        assert {c.risk for c in REGISTRY.get(opt_name).candidates} == {"changes_model"}
    assert all(Capability.SEVERAL_RANKS in c.requires for c in REGISTRY.get("ddp").candidates)
