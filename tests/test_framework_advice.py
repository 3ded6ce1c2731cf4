"""Advice for one's own training, in its own terms: real Hugging Face Trainer, Lightning and plain-loop
runs of small models built from a config, on the CPU, advised the changes their bottlenecks call for as
TrainingArguments, Trainer arguments or lines of PyTorch, each with the range the catalog models for its
equivalent switch on the run's own breakdown, or, for the autocast change, the range measured on the
model at its train end, and never a change the run has made already.

The Trainer's runs read a dataset that sleeps in `__getitem__` (an input-bound step): one with no loader
workers and fp32 matmuls, and one of a smaller model with a worker and bf16, the changes the first is
advised, made already. The Lightning run trains the first's model at its shapes (timed once a process).
"""

from __future__ import annotations

import html
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from optimizers import REGISTRY
from optimizers.vocabulary import Bottleneck
from profiler import api
from profiler.advice.diagnose import LOW_PRECISION_SPEEDUP
from profiler.advice.framework import own_advice
from profiler.advice.recommend import expected
from profiler.analysis import RunData, analyze, load_run
from profiler.cli import main as glmperf_main
from profiler.instruments.machine import cpu_flags
from tests.conftest import ROOT
from tests.test_own_training import QUICK, glmperf

GPT2 = {"vocab_size": 512, "n_positions": 128, "n_embd": 512, "n_layer": 1, "n_head": 8, "bos_token_id": 0,
        "eos_token_id": 0}
"""Matmuls of 1024 x 512 x 2048 a batch: large enough that bf16 pays on a CPU with native bf16."""
SEQ_LEN, BATCH, STEPS = 128, 8, 3
PROFILE = {**QUICK, "trace_window": [0, 1, 1]}
"""Step 0 warms up, step 1 is traced (the operators' shares), the rest are counted."""
SLEEP_S = 0.08
"""Each sample's read: 0.64 s a batch, over a tenth of the fp32 step on a busy machine too."""
NATIVE_BF16 = bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))
needs_bf16 = pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16 (avx512_bf16 or amx_bf16): "
                                                        "bf16 matmuls are emulated here, so never advised")


class SlowCounting(torch.utils.data.Dataset):
    """Token sequences counting up, each read after a sleep (a slow store)."""

    def __len__(self) -> int:
        return (STEPS + 1) * BATCH  # the loader reads one batch ahead: the last step's read is the one after

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(SLEEP_S)
        ids = (torch.arange(SEQ_LEN) + i) % GPT2["vocab_size"]
        return {"input_ids": ids, "labels": ids}


def gpt2(**config: Any) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**{**GPT2, **config}, attn_implementation="eager"))


def hf_run(runs: Path, name: str, model: torch.nn.Module, **arguments: Any) -> RunData:
    from transformers import Trainer, TrainingArguments

    from profiler.integrations.hf import GlmperfCallback

    with tempfile.TemporaryDirectory() as out, GlmperfCallback(name=name, runs_dir=runs, profile=PROFILE) as cb:
        args = TrainingArguments(output_dir=out, max_steps=STEPS, per_device_train_batch_size=BATCH, use_cpu=True,
                                 save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
                                 **arguments)
        Trainer(model=model, args=args, train_dataset=SlowCounting(), callbacks=[cb]).train()
    return load_run(cb.last_run.dir)


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunData]:
    runs = tmp_path_factory.mktemp("framework_runs")
    return {"plain": hf_run(runs, "hf-plain", gpt2(), dataloader_num_workers=0),
            "tuned": hf_run(runs, "hf-tuned", gpt2(n_embd=64, n_head=4), dataloader_num_workers=1, bf16=True)}


def recs(run: RunData) -> list[dict[str, Any]]:
    """The recommendations stored with the run when it ended (run.json diagnosis)."""
    return run.record["diagnosis"]["recommendations"]


def assumed(run: RunData, kind: Bottleneck) -> dict[str, Any]:
    """The run's advice were `kind` its one bottleneck: what its settings leave to change for it."""
    return own_advice(run, analyze(run), {"bottlenecks": [{"kind": str(kind), "severity": 1.0}]})


def sets(recommendations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["set"] for r in recommendations]


def judged(advice: dict[str, Any]) -> list[dict[str, Any]]:
    """The catalog changes the advice proposed or excluded: not those it passed by as made already."""
    return [r["change"]["catalog"] for r in advice["recommendations"]] + [e["set"] for e in advice["excluded"]]


def catalog_range(switch: str, settings: dict[str, Any], run: RunData) -> dict[str, Any]:
    """The tokens/s range the catalog's own candidate for `settings` has on this run's figures."""
    opt = next(o for o in REGISTRY if o.name == switch)
    candidate = next(c for c in opt.candidates if set(c.set) == set(settings) and c.applies(opt.config()))
    return expected(candidate, analyze(run))["tokens_per_s"]


def bf16_pays(run: RunData) -> None:
    """Skip unless bf16 matmuls measured faster at this model's shapes on this machine."""
    speedup = analyze(run)["bf16_speedup"].value
    if not speedup >= LOW_PRECISION_SPEEDUP:
        pytest.skip(f"bf16 matmuls at this model's shapes ran {speedup:.2f}x fp32 on this machine, below the "
                    f"{LOW_PRECISION_SPEEDUP}x bf16 is advised from")


def test_an_input_bound_trainer_is_advised_loader_workers_with_the_catalogs_range(hf_runs) -> None:
    run = hf_runs["plain"]
    assert run.config["framework"]["settings"]["dataloader_num_workers"] == 0  # recorded by the callback
    assert any(b["kind"] == "input_bound" for b in run.record["diagnosis"]["bottlenecks"])  # the fetch is timed
    rec = next(r for r in recs(run) if r["set"] == {"TrainingArguments.dataloader_num_workers": 2})
    assert rec["change"] == {"framework": "hf", "text": "TrainingArguments(..., dataloader_num_workers=2)",
                             "catalog": {"switches.dataloader.num_workers": 2}}
    assert rec["for"] == "input_bound" and rec["expected"]["source"] == "modelled"
    assert rec["expected"]["basis"].startswith("modelled as the catalog's switches.dataloader.num_workers=2: "
                                               "Amdahl: data")
    assert rec["expected"]["tokens_per_s"] == catalog_range("dataloader", rec["change"]["catalog"], run)
    assert rec["expected"]["tokens_per_s"]["low"] > 0 and "command" not in rec


def test_a_trainer_with_loader_workers_already_is_not_advised_them(hf_runs) -> None:
    workers = {"TrainingArguments.dataloader_num_workers": 2}
    assert workers not in sets(recs(hf_runs["tuned"]))
    assert workers in sets(assumed(hf_runs["plain"], Bottleneck.INPUT_BOUND)["recommendations"])
    # were its step input bound, the worker it has already is what it does: the change is passed by
    assert {"switches.dataloader.num_workers": 2} not in judged(assumed(hf_runs["tuned"], Bottleneck.INPUT_BOUND))


@needs_bf16
def test_fp32_matmuls_on_a_native_bf16_cpu_are_advised_bf16_in_training_arguments(hf_runs) -> None:
    plain, tuned = hf_runs["plain"], hf_runs["tuned"]
    bf16_pays(plain)
    rec = next(r for r in recs(plain) if r["set"] == {"TrainingArguments.bf16": True})
    assert rec["change"]["text"] == "TrainingArguments(..., bf16=True)" and rec["risk"] == "numerics"
    # measured at the train end on the model and its first batch, through this run's breakdown
    (probe,) = plain.record["own_probes"]
    assert probe["change"] == {"switches.amp.dtype": "bf16"} and probe["cand"][0]["forward"] > 0
    assert rec["expected"]["source"] == "measured"
    assert rec["expected"]["basis"].startswith("on your model and a batch of this run, at its train end: probe: ")
    assert rec["expected"]["tokens_per_s"] != catalog_range("amp", {"switches.amp.dtype": "bf16"}, plain)
    # a run with bf16 already is never advised it, even were its step compute bound: the change is passed by
    assert {"TrainingArguments.bf16": True} in sets(assumed(plain, Bottleneck.COMPUTE_BOUND)["recommendations"])
    assert tuned.config["framework"]["settings"]["bf16"] is True and tuned.peak["dtype"] == "bf16"
    assert {"switches.amp.dtype": "bf16"} not in judged(assumed(tuned, Bottleneck.COMPUTE_BOUND))


@needs_bf16
def test_a_lightning_run_is_advised_its_trainers_precision(tmp_path: Path) -> None:
    import lightning as L

    from profiler.integrations.lightning import GlmperfCallback

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = gpt2()

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    loader = torch.utils.data.DataLoader(FastCounting(), batch_size=BATCH)
    callback = GlmperfCallback(name="lightning", runs_dir=tmp_path, profile=PROFILE,
                               probe_loss=lambda module, batch: module.training_step(batch, 0))
    L.Trainer(max_steps=STEPS, callbacks=[callback], logger=False, enable_checkpointing=False, accelerator="cpu",
              enable_progress_bar=False, enable_model_summary=False).fit(LM(), loader)
    run = load_run(callback.last_run.dir)
    assert run.config["framework"] == {"name": "lightning", "settings": {
        "precision": "32-true", "accumulate_grad_batches": 1, "strategy": "SingleDeviceStrategy", "compile": False,
        "optimizer": "AdamW", "fused": False, "num_workers": 0, "pin_memory": False, "batch_size": BATCH}}
    bf16_pays(run)
    rec = next(r for r in recs(run) if r["switch"] == "amp")
    assert rec["set"] == {"L.Trainer.precision": "bf16-mixed"}
    assert rec["change"]["text"] == 'L.Trainer(..., precision="bf16-mixed")'
    assert rec["expected"]["source"] == "measured"  # through its probe_loss on its first batch, at the train end


class FastCounting(SlowCounting):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = (torch.arange(SEQ_LEN) + i) % GPT2["vocab_size"]
        return {"input_ids": ids, "labels": ids}


def test_a_plain_loop_is_advised_the_lines_of_pytorch_to_add(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))
    opt = torch.optim.AdamW(model.parameters())
    with api.run(name="loop", runs_dir=tmp_path, model=model, profile=PROFILE) as run:
        for _ in range(STEPS + 1):
            with run.step(tokens=64, batch_size=4) as step:
                with run.phase("data"):
                    time.sleep(0.03)  # a slow read
                    batch = torch.randint(0, 64, (4, 16))
                with run.phase("forward"):
                    loss = model(batch).logsumexp(-1).mean()
                with run.phase("backward"):
                    loss.backward()
                with run.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                step.loss = loss.detach()
    stored = load_run(run.dir)
    assert stored.config["framework"] == {"name": "torch", "settings": {"autocast": "off", "compile": False}}
    rec = next(r for r in recs(stored) if r["switch"] == "dataloader")
    assert rec["set"] == {"DataLoader.num_workers": 2} and rec["change"]["framework"] == "torch"
    assert rec["change"]["text"] == "DataLoader(..., num_workers=2)"
    code = {r["change"]["text"] for r in assumed(stored, Bottleneck.COMPUTE_BOUND)["recommendations"]}
    assert "model = torch.compile(model)" in code
    assert any(text.startswith('with torch.autocast("cpu", dtype=torch.bfloat16):') for text in code) == (
        analyze(stored)["bf16_speedup"].value >= LOW_PRECISION_SPEEDUP)


def test_recommend_prints_and_the_report_and_dashboard_show_the_exact_change(hf_runs, capsys, monkeypatch) -> None:
    run = hf_runs["plain"]
    code, out = glmperf("recommend", str(run.path), "--json", capsys=capsys)
    printed = json.loads(out)["recommendations"]
    assert code == 0 and "probes" not in json.loads(out)  # nothing to probe: no config of ours to build
    change = next(r["change"] for r in printed if r["switch"] == "dataloader")
    assert change["text"] == "TrainingArguments(..., dataloader_num_workers=2)"
    code, out = glmperf("recommend", str(run.path), capsys=capsys)
    assert code == 0 and f"change: {change['text']}" in out and f"glmperf recommend {run.id} --verify -- COMMAND" in out
    report = html.unescape((run.path / "report.html").read_text(encoding="utf-8"))  # written when it ended
    assert change["text"] in report

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("GLMPERF_RUNS", str(run.path.parent))
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=120)
    at.query_params.update(run=run.id)
    at.switch_page("app_pages/run.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert change["text"] in [c.value for c in at.code]


def test_verify_refuses_a_run_of_ones_own_training_in_one_line(hf_runs, capsys) -> None:
    run = hf_runs["plain"]
    capsys.readouterr()
    code = glmperf_main(["recommend", str(run.path), "--verify"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"run {run.id} is your own training" in err and f"glmperf recommend {run.id} --verify -- COMMAND" in err
