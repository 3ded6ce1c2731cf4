"""Profiling a user's own training: the three examples in docs/examples/ run for real (a plain
PyTorch loop, a Hugging Face Trainer, a Lightning Trainer, each on a tiny model built from a config),
and their runs are held against what each loop itself counted; then failures, Ctrl-C, bad use of
the API, a missing framework, and two gloo ranks under torchrun.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from profiler import api, store
from profiler.analysis import load_run
from profiler.cli import main as glmperf_main
from profiler.metrics import PHASE_COLUMNS
from tests.conftest import ROOT

EXAMPLES = ROOT / "docs" / "examples"
STEPS = 10
QUICK = {"trace_window": [1, 1, 2], "sample_hz": 20, "flush_interval_s": 0.2, "warmup_steps": 1}
"""Profile settings that keep an in-process run short and flushing often."""


def run_example(script: str, runs_dir: Path, *launcher: str) -> tuple[Path, list[dict[str, int]]]:
    """Run an example as a user does; its run directory and what each rank's loop counted itself."""
    cmd = [*launcher, str(EXAMPLES / script)] if launcher else [sys.executable, str(EXAMPLES / script)]
    proc = subprocess.run([*cmd, "--runs-dir", str(runs_dir), "--steps", str(STEPS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    did = [{"rank": int(m[0]), "steps": int(m[1]), "tokens": int(m[2])}
           for m in re.findall(r"rank (\d+) did: steps=(\d+) tokens=(\d+)", proc.stdout)]
    run_dir = Path(re.search(r"^run: (\S+) \(completed\)$", proc.stdout, re.M).group(1))
    assert f"glmperf diagnose {run_dir.name}" in proc.stdout  # it ends with the commands to look at it
    return run_dir, sorted(did, key=lambda d: d["rank"])


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[dict[str, int]]]]:
    runs = tmp_path_factory.mktemp("own_runs")
    return {name: run_example(script, runs) for name, script in
            (("torch", "own_loop_torch.py"), ("hf", "own_training_hf.py"), ("lightning", "own_training_lightning.py"))}


def glmperf(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = glmperf_main(list(args))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("example", ["torch", "hf", "lightning"])
def test_each_example_makes_a_complete_run_that_matches_its_loop(example_runs, example: str, capsys) -> None:
    run_dir, (did,) = example_runs[example]
    run = load_run(run_dir)
    assert run.status == "completed" and run.source == "api" and not run.problems
    steps = run.steps
    assert list(steps["step"]) == list(range(did["steps"])) == list(range(STEPS))
    assert int(steps["tokens"].sum()) == did["tokens"]
    # the phases the framework exposes were timed in every step, and they add up to the step
    timed = ["forward_s", "backward_s", "optimizer_s"] + (["data_s", "h2d_s"] if example == "torch" else [])
    assert (steps[timed] > 0).all().all(), steps[timed]
    assert ((steps[list(PHASE_COLUMNS)].sum(axis=1) - steps["step_s"]).abs() < 1e-6).all()
    assert steps["loss"].notna().all() and steps["loss"].iloc[-1] < steps["loss"].iloc[0]
    summary = run.record["summary"]
    assert summary["tokens_per_s"] > 0 and summary["steps_counted"] > 0
    model = run.record["model"]
    assert model["external"] and model["num_params"] > 0 and model["class"].endswith(
        {"torch": "TinyLM", "hf": "GPT2LMHeadModel", "lightning": "CountingLM"}[example])
    assert model["flops_per_token"] == 6 * model["num_params"] and 0 < summary["mfu"] < 1
    assert any("6N" in note for note in summary["notes"])
    # the switches section is absent, not the reference trainer's defaults; advice is in the framework's terms
    assert "switches" not in run.config and "switches_applied" not in run.record
    assert run.config["framework"]["name"] == example and "error" not in run.record["diagnosis"]
    assert all(r["change"]["framework"] == example for r in run.record["diagnosis"]["recommendations"])
    code, out = glmperf("diagnose", str(run_dir), "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["verdict"]
    code, out = glmperf("runs", "--runs-dir", str(run_dir.parent), "--json", capsys=capsys)
    assert code == 0 and run_dir.name in {r["id"] for r in json.loads(out)}


def test_the_run_keeps_the_users_config(example_runs) -> None:
    run = load_run(example_runs["torch"][0])
    assert run.config["user"]["d_model"] == 64 and run.config["profile"]["warmup_steps"] == 2
    hf = load_run(example_runs["hf"][0])
    assert hf.config["user"]["seq_len"] == 64 and hf.config["user"]["model"]["n_layer"] == 2


def test_a_run_of_ones_own_loop_has_its_report(example_runs, capsys) -> None:
    run_dir = example_runs["lightning"][0]
    assert "own-lightning" in (run_dir / "report.html").read_text(encoding="utf-8")  # written when it ended
    code, _ = glmperf("report", str(run_dir), "-o", str(run_dir.parent / "again.html"), capsys=capsys)
    assert code == 0 and "Step-time breakdown" in (run_dir.parent / "again.html").read_text(encoding="utf-8")


def _loop(run: api.Run, steps: int, *, fail_at: int | None = None, exc: BaseException | None = None) -> None:
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        with run.step(tokens=32) as step:
            with run.phase("forward"):
                loss = model(torch.randn(32, 16)).pow(2).mean()
            with run.phase("backward"):
                loss.backward()
            if i == fail_at:
                raise exc
            with run.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            step.loss = loss.detach()


@pytest.mark.parametrize("exc, status", [(RuntimeError("diverged at step 3"), "failed"),
                                         (KeyboardInterrupt("Ctrl-C"), "interrupted")])
def test_an_exception_in_the_loop_keeps_every_step_before_it(tmp_path: Path, exc: BaseException,
                                                              status: str) -> None:
    with pytest.raises(type(exc)), api.run(name="crash", runs_dir=tmp_path, profile={**QUICK, "trace": False}) as run:
        _loop(run, 10, fail_at=3, exc=exc)
    record = store.read_run(run.dir)
    assert record["status"] == status and str(exc) in record["error"]
    assert list(store.read_table(run.dir, "steps")["step"]) == [0, 1, 2]
    assert not (run.dir / "parts").exists() or not list((run.dir / "parts").glob("steps-*"))
    if status == "failed":
        assert "diverged at step 3" in record["ranks"][0]["traceback"]


def test_mfu_is_absent_and_said_so_without_model_or_flops(tmp_path: Path) -> None:
    with api.run(name="no-flops", runs_dir=tmp_path, profile=QUICK) as run:
        _loop(run, 6)
    summary = store.read_run(run.dir)["summary"]
    assert summary["mfu"] is None and any("not known" in n for n in summary["notes"])  # not measured: null
    with api.run(name="given", runs_dir=tmp_path, profile={**QUICK, "trace": False}, flops_per_token=1e6) as run:
        _loop(run, 4)
    record = store.read_run(run.dir)
    assert record["model"]["flops_source"].startswith("given") and record["summary"]["mfu"] > 0


def test_the_trace_window_covers_the_users_phases(tmp_path: Path) -> None:
    with api.run(name="traced", runs_dir=tmp_path, profile=QUICK) as run:
        _loop(run, 6)
    ops = store.read_table(run.dir, "ops")
    assert {"glmperf/forward", "glmperf/backward", "glmperf/optimizer"} <= set(ops["name"])
    assert store.trace_paths(run.dir) and list(store.read_table(run.dir, "steps")["profiled"])[1:3] == [True, True]


def test_bad_use_says_what_is_wrong_and_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) nmae; allowed: name, runs_dir"):
        api.run(nmae="x")
    with pytest.raises(Exception, match=r"profile.sample: unknown key; allowed: trace, trace_window"):
        api.run(runs_dir=tmp_path, profile={"sample": 5})
    with api.run(name="misuse", runs_dir=tmp_path, profile={**QUICK, "trace": False}) as run:
        with pytest.raises(api.UsageError, match="outside a step"):
            run.begin_phase("forward")
        with run.step(tokens=1):
            with pytest.raises(api.UsageError, match="inside step 0: steps follow one another"):
                run.begin_step()
            with run.phase("forward"), pytest.raises(api.UsageError, match="'backward' opened inside phase 'forward'"):
                run.begin_phase("backward")
        with pytest.raises(api.UsageError, match="no token count, so it was not recorded"), run.step():
            pass
        with run.step(tokens=2):  # the loop goes on: the step without tokens was dropped
            pass
    assert store.read_run(run.dir)["status"] == "completed"
    assert list(store.read_table(run.dir, "steps")["tokens"]) == [1, 2]


def test_callbacks_take_the_same_keywords_and_import_no_framework_until_used() -> None:
    from profiler.integrations.hf import GlmperfCallback as Hf
    from profiler.integrations.lightning import GlmperfCallback as Pl

    for callback in (Hf, Pl):
        with pytest.raises(TypeError, match="unknown keyword.*allowed: name, runs_dir, config"):
            callback(nmae="x")
    code = ("import sys; import profiler.integrations.hf, profiler.integrations.lightning; "
            "print(sorted(m for m in ('transformers', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("module, framework, extra", [("hf", "transformers", "hf"),
                                                      ("lightning", "lightning.pytorch", "lightning")])
def test_a_missing_framework_names_the_extra_to_install(module: str, framework: str, extra: str) -> None:
    code = (f"import sys; sys.modules[{framework!r}] = None\n"
            f"from profiler.integrations.{module} import GlmperfCallback")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"pip install -e '.[{extra}]'" in proc.stderr.strip().splitlines()[-1]


def test_a_lightning_fit_that_raises_leaves_the_run_failed_with_its_steps(tmp_path: Path) -> None:
    import lightning as L

    from profiler.integrations.lightning import GlmperfCallback

    class Breaks(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 8)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            if batch_idx == 4:
                raise ValueError("bad batch 4")
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = GlmperfCallback(name="pl-crash", runs_dir=tmp_path, profile={**QUICK, "trace": False})
    trainer = L.Trainer(max_steps=10, callbacks=[callback], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    with pytest.raises(ValueError, match="bad batch 4"):
        trainer.fit(Breaks(), torch.utils.data.DataLoader(torch.randn(80, 8), batch_size=8))
    record = store.read_run(callback.last_run.dir)
    assert record["status"] == "failed" and "bad batch 4" in record["error"]
    assert list(store.read_table(callback.last_run.dir, "steps")["step"]) == [0, 1, 2, 3]


@pytest.mark.slow
def test_two_gloo_ranks_under_torchrun_write_one_run(tmp_path: Path) -> None:
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    run_dir, did = run_example("own_loop_torch.py", tmp_path, *launcher)
    assert [d["rank"] for d in did] == [0, 1] and [p.name for p in tmp_path.iterdir()] == [run_dir.name]
    run = load_run(run_dir)
    assert run.status == "completed" and run.world_size == 2
    assert sorted(r["status"] for r in run.ranks) == ["completed", "completed"]
    steps = run.steps
    for d in did:
        mine = steps[steps["rank"] == d["rank"]]
        assert len(mine) == d["steps"] == STEPS and int(mine["tokens"].sum()) == d["tokens"]
        # the default window (wait 2, warmup 1, active 3), and the step after it, whose first collective
        # waits for every rank's export of the trace: all left out of the summaries
        assert list(mine.loc[mine["profiled"], "step"]) == [2, 3, 4, 5, 6]
    summary = run.record["summary"]
    assert summary["comm"]["calls_per_step"] >= 1 and "straggler" in summary
    assert pd.notna(summary["tokens_per_s"]) and summary["tokens_per_s"] > 0


def test_the_dashboard_shows_runs_of_ones_own_loop(example_runs, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    runs_dir = example_runs["torch"][0].parent
    monkeypatch.setenv("GLMPERF_RUNS", str(runs_dir))
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=120)
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert {p.name for p, _ in example_runs.values()} <= set(at.dataframe[0].value["run"])
    at.query_params.update(run=example_runs["hf"][0].name)
    at.switch_page("app_pages/run.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [h.value for h in at.header] == [example_runs["hf"][0].name]
    assert load_run(example_runs["hf"][0]).record["diagnosis"]["verdict"] in "\n".join(m.value for m in at.markdown)
    assert len(at.get("plotly_chart")) >= 4 and not at.error


def test_a_trainer_that_raises_leaves_the_run_failed_with_its_steps(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from profiler.integrations.hf import GlmperfCallback

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    forwards = []

    def breaks(module, args, kwargs):
        forwards.append(1)
        if len(forwards) == 4:
            raise RuntimeError("out of memory at the 4th batch")

    model.register_forward_pre_hook(breaks, with_kwargs=True)
    ids = torch.randint(0, 64, (48, 16))
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4,
                             report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True)
    with pytest.raises(RuntimeError, match="4th batch"), GlmperfCallback(
            name="hf-crash", runs_dir=tmp_path, profile={**QUICK, "trace": False}) as callback:
        Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    record = store.read_run(callback.last_run.dir)
    assert record["status"] == "failed" and "4th batch" in record["error"]
    steps = store.read_table(callback.last_run.dir, "steps")
    assert list(steps["step"]) == [0, 1, 2] and list(steps["tokens"]) == [64, 64, 64]
