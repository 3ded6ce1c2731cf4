"""What-if probes on one's own model at its train end: the autocast change timed on the model and a batch
of the run, side by side with the run's own setting, leaving the model's gradients and the RNG as they
were; a CPU without native bf16 is never probed for it (it is never advised there)."""

from __future__ import annotations

import pytest
import torch

from profiler.analysis.environment import NATIVE_BF16_FLAGS
from profiler.capture.own_probe import changes_for, probe_own
from profiler.instruments.machine import cpu_flags

NATIVE = bool(NATIVE_BF16_FLAGS & set(cpu_flags()))
CPU = torch.device("cpu")


def _model_and_loss() -> tuple[torch.nn.Module, object, int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    x = torch.randn(1024, 512)
    return model, lambda: model(x).pow(2).mean(), 1024


def test_a_low_precision_run_is_probed_at_fp32_and_fp32_at_bf16_only_where_it_is_native() -> None:
    assert changes_for("bf16", CPU) == ["off"] and changes_for("fp16", CPU) == ["off"]
    assert changes_for("off", CPU) == (["bf16"] if NATIVE else [])


def test_the_probe_times_forward_and_backward_and_leaves_the_model_as_it_was() -> None:
    model, loss_of, tokens = _model_and_loss()
    loss_of().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    rng = torch.random.get_rng_state()
    (probe,) = probe_own(model, loss_of, tokens=tokens, device=CPU, amp="bf16", budget_s=5.0)
    assert probe.change == {"switches.amp.dtype": "off"} and probe.rounds >= 2
    for side in (probe.base, probe.cand):
        assert all(r["forward"] > 0 and r["backward"] > 0 and r["optimizer"] == 0 for r in side)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert probe_own(model, loss_of, tokens=tokens, device=CPU, amp="bf16", budget_s=0.0) == []


@pytest.mark.skipif(not NATIVE, reason="this CPU has no native bf16: an fp32 run is not probed for it")
def test_native_bf16_reads_faster_than_fp32_on_large_enough_matmuls() -> None:
    model, loss_of, tokens = _model_and_loss()
    (probe,) = probe_own(model, loss_of, tokens=tokens, device=CPU, amp="off", budget_s=4.0)
    assert probe.change == {"switches.amp.dtype": "bf16"}
    ratios = sorted(probe.step_ratios())
    assert ratios[len(ratios) // 2] < 0.9, ratios


def test_a_plain_loop_probes_through_its_run_and_a_failing_probe_costs_only_its_measurement(tmp_path) -> None:
    from profiler import api, store

    model, loss_of, tokens = _model_and_loss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    profile = {"trace": False, "sample_hz": 0, "warmup_steps": 0, "probe_budget_s": 2.0}
    with api.run(name="plain", runs_dir=tmp_path, model=model, profile=profile) as run:
        for _ in range(3):
            with run.step(tokens=tokens) as step:
                loss = loss_of()
                loss.backward()
                opt.step()
                opt.zero_grad()
                step.loss = loss.detach()
        run.probe(model, loss_of, tokens=tokens)
    record = store.read_run(run.dir)
    assert record["status"] == "completed"
    assert [p["change"] for p in record.get("own_probes", [])] == ([{"switches.amp.dtype": "bf16"}] if NATIVE else [])

    def broken() -> torch.Tensor:
        raise RuntimeError("no such batch")
    with api.run(name="broken", runs_dir=tmp_path, model=model, profile=profile, amp="bf16") as run:
        with run.step(tokens=tokens):
            pass
        run.probe(model, broken, tokens=tokens)
    record = store.read_run(run.dir)
    assert record["status"] == "completed" and record["own_probes_error"] == "RuntimeError: no such batch"
