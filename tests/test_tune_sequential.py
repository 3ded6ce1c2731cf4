"""Sequential verification (repeats added while a verdict is open, each look at a stricter confidence),
the order tune tries changes in, and its round that verifies the changes together: on real `tiny`
runs where the gain is induced (a loader delay taken away) or none (the config itself)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from profiler import store
from profiler.advice.spread import PRIOR_DOF, PRIOR_SIGMA, Spread, run_to_run
from profiler.analysis import load_run
from profiler.cli import tune as cli_tune
from profiler.cli.tune import _print as print_tune
from profiler.compare.stats import confidence_text
from profiler.config import load_config
from profiler.experiments import tune as tune_module
from profiler.experiments.batch import run_cells
from profiler.experiments.sequential import Looks, Sequential
from profiler.experiments.tune import Tuner, TuneSpec, combination, order
from profiler.experiments.verify import CONFIDENCE, trials_for
from profiler.text import measured_text
from tests.conftest import TINY, glmperf, tiny_run


def rec(settings: dict, gain: tuple[float, float] | None = (10.0, 20.0), judged_by: str = "tokens_per_s",
        **expected: str) -> dict:
    """A recommendation as recommend writes it (the fields verify and tune read)."""
    exp = {"tokens_per_s": {"low": gain[0], "high": gain[1], "unit": "%"}} if gain else {}
    return {"switch": next(iter(settings)).split(".")[1], "set": settings, "judged_by": judged_by, "risk": "none",
            "expected": {**exp, "basis": "test", **expected}, "for": "test"}


def test_each_look_spends_a_share_of_the_confidence_bonferroni():
    assert Looks(3, 3).per_look == CONFIDENCE == 0.99  # one look: compare's own interval
    assert Looks(2, 6).count == 5 and Looks(2, 6).per_look == pytest.approx(0.998)
    assert 1 - Looks(2, 4).per_look == pytest.approx((1 - CONFIDENCE) / 3)
    with pytest.raises(ValueError, match="start 3 and most 2"):
        Looks(3, 2)
    # a look's confidence is said with its digits, never rounded up to a certainty
    assert [confidence_text(Looks(2, m).per_look) for m in (2, 4, 6)] == ["99%", "99.67%", "99.8%"]
    measured = {"metric": "tokens_per_s", "change_pct": 30.0, "low_pct": 5.0, "high_pct": 60.0,
                "confidence": Looks(2, 4).per_look, "runs": [3, 3]}
    assert measured_text(measured) == "tokens/s gain +30.0% [+5.0%, +60.0%] (99.67% interval, 3+3 runs)"


def test_tune_tries_limit_remedies_first_then_speed_changes_by_expected_gain_measured_first_on_a_tie():
    memory = rec({"switches.activation_checkpointing.mode": "full"}, (-20.0, -10.0), judged_by="peak_memory")
    small = rec({"switches.dataloader.num_workers": 2}, (5.0, 10.0))
    big = rec({"switches.amp.dtype": "bf16"}, (30.0, 50.0))
    modelled = rec({"switches.compile.mode": "default"}, (20.0, 22.0), source="modelled")  # 21%
    measured = rec({"switches.optimizer.impl": "fused"}, (20.4, 21.4), source="measured")  # 20.9%: a tie
    unknown = rec({"switches.dataloader.pin_memory": True}, None)
    ordered = order([small, modelled, unknown, measured, memory, big])
    assert ordered == [memory, big, measured, modelled, small, unknown]
    assert order([modelled, small]) == [modelled, small] and order([small, modelled]) == [modelled, small]


def test_the_changes_verified_together_are_the_promising_ones_on_the_adopted_or_two_adopted_against_the_start():
    def entry(settings: dict, verdict: str, change_pct: float, metric: str = "tokens_per_s") -> dict:
        return {"kind": "change", "tried": settings,
                "result": {"verdict": verdict, "measured": {"metric": metric, "change_pct": change_pct}}}

    bf16 = {"switches.amp": "bf16"}
    rounds = [entry(bf16, "confirmed", 90.0),
              entry({"switches.dataloader.num_workers": 2}, "inconclusive", 9.0),
              entry({"switches.compile.mode": "default"}, "inconclusive", 17.0),
              entry({"switches.amp.dtype": "fp16"}, "inconclusive", 30.0),  # sets what bf16 set: left out
              entry({"switches.optimizer.impl": "fused"}, "inconclusive", -3.0),  # no measured gain
              entry({"switches.activation_checkpointing.mode": "full"}, "inconclusive", 5.0, "peak_memory"),
              entry({"switches.optimizer.impl": "foreach"}, "refuted", 4.0)]
    together = combination(rounds, [bf16])
    assert together == {"set": {"switches.compile.mode": "default", "switches.dataloader.num_workers": 2},
                        "combined": [{"switches.compile.mode": "default"}, {"switches.dataloader.num_workers": 2}],
                        "against": "adopted"}
    assert combination(rounds[2:3], [bf16])["against"] == "adopted"  # one adopted and one promising
    assert combination(rounds[2:3], []) is None  # one change alone was verified already
    assert combination(rounds[:1], [bf16]) is None
    two = [bf16, {"switches.dataloader.num_workers": 2}]
    assert combination(rounds[:1], two) == {"set": {"switches.amp.dtype": "bf16", "switches.dataloader.num_workers": 2},
                                            "combined": two, "against": "start"}


def _verify(run_dir, change: dict, runs_dir, *, most: int, may_add=None) -> tuple[dict, list]:
    """A sequential verification of `change` on the run's config from 2 repeats; its result and cells."""
    trials = trials_for(load_run(run_dir), [rec(change)], repeats=2, steps=14)
    ran: list = []

    def execute(cells):
        ran.extend(cells)
        return run_cells(cells, runs_dir=runs_dir, progress=False)

    verification = Sequential(trials, most=most).run(execute, may_add=may_add)
    return verification, ran


@pytest.mark.slow
def test_a_clear_gain_is_confirmed_at_the_starting_repeats_without_adding_any(tmp_path):
    # batches 80 ms late against a step of about 10 ms: taking the delay away is several times faster
    base = tiny_run(tmp_path / "base", "train.steps=14", "profile.trace=false", "data.io_delay_ms=80")
    verification, ran = _verify(base, {"data.io_delay_ms": 0}, tmp_path / "cells", most=4)
    (result,) = verification["results"]
    assert result["verdict"] == "confirmed", result["reason"]
    assert (result["repeats"], result["stopped"]) == (2, "decided")
    assert [c.links["verifies"]["trial"] for c in ran] == ["baseline", "io_delay_ms"] * 2
    assert result["measured"]["confidence"] == pytest.approx(1 - (1 - CONFIDENCE) / 3)  # 3 looks were allowed
    assert verification["sequential"] == {"start": 2, "most": 4, "confidence": CONFIDENCE,
                                          "per_look": Looks(2, 4).per_look}
    assert verification["complete"] and verification["repeats"] == 2


@pytest.mark.slow
def test_a_change_of_nothing_runs_to_the_most_repeats_and_stays_inconclusive(tmp_path, monkeypatch):
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path / "cache"))
    base = tiny_run(tmp_path / "base", "train.steps=14", "profile.trace=false")
    same = {"data.io_delay_ms": 0}  # what the run already does: any difference is the machine's noise
    verification, ran = _verify(base, same, tmp_path / "cells", most=4)
    (result,) = verification["results"]
    assert result["verdict"] == "inconclusive", result["reason"]
    assert (result["repeats"], result["stopped"]) == (4, "max_repeats")
    assert len(result["runs"]) == 4 and len(verification["baseline_runs"]) == verification["repeats"] == 4
    assert [c.links["verifies"]["repeat"] for c in ran] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [c.cfg.profile.trace for c in ran] == [False] * 8
    # what the 4 + 4 fresh runs of two configs showed of this machine is kept for the next advice
    tps = [[store.read_run(Path(r["path"]))["summary"]["tokens_per_s"] for r in store.list_runs(tmp_path / "cells")
            if r["verifies"]["trial"] == trial] for trial in ("baseline", "io_delay_ms")]
    logs = [[math.log(x) for x in group] for group in tps]
    squares = sum(sum((x - sum(g) / 4) ** 2 for x in g) for g in logs)
    pooled = math.sqrt((squares + PRIOR_DOF * PRIOR_SIGMA**2) / (6 + PRIOR_DOF))  # with the prior's weight
    assert run_to_run("tokens_per_s", "cpu") == Spread(pytest.approx(pooled), runs=8, groups=2)
    # a time budget that allows no more cells stops it at the first look
    asked: list[int] = []
    verification, ran = _verify(base, same, tmp_path / "budget", most=4, may_add=lambda n: asked.append(n) or False)
    (result,) = verification["results"]
    assert (result["verdict"], result["repeats"], result["stopped"]) == ("inconclusive", 2, "time_budget")
    assert asked == [2] and len(ran) == 4


@pytest.mark.slow
def test_tune_tries_the_larger_expected_gain_first_and_verifies_two_adopted_changes_together(tmp_path, monkeypatch):
    # two sure gains, each a few times faster: the loader's delay (a sleep per batch, the step's compute
    # about 10 ms) cut from 150 to 40 ms, then taken away
    less_delay = rec({"data.io_delay_ms": 40}, (60.0, 80.0))
    no_delay = rec({"data.io_delay_ms": 0}, (20.0, 30.0))

    def advise(run, **_):  # the advice lists the smaller expected gain first
        return {"verdict": "input_bound (test)", "bottlenecks": [{"kind": "input_bound"}],
                "recommendations": [no_delay, less_delay]}

    monkeypatch.setattr(tune_module, "advise", advise)
    start = load_config(preset="tiny", overrides=[*TINY, "profile.trace=false", "train.steps=14",
                                                  "data.io_delay_ms=150"])
    runs_dir = tmp_path / "runs"
    record = Tuner(TuneSpec(start, repeats=2, max_repeats=4), runs_dir=runs_dir, progress=False).run()
    first, second, together = record["rounds"]
    assert first["tried"] == less_delay["set"] and second["tried"] == no_delay["set"]
    assert [first["decision"], second["decision"]] == ["adopted", "adopted"], [first["why"], second["why"]]
    assert record["adopted"] == [less_delay["set"], no_delay["set"]]
    assert together["kind"] == "combination" and together["against"] == "start"
    assert together["combined"] == record["adopted"]
    assert together["tried"] == {"data.io_delay_ms": 0}  # the later change of a key wins
    assert together["diagnosed_run"] == record["start_run"]
    assert together["result"]["verdict"] == "confirmed" and together["decision"] == "kept", together
    assert together["result"]["measured"]["change_pct"] > max(first["result"]["measured"]["change_pct"],
                                                               second["result"]["measured"]["change_pct"])
    for entry in record["rounds"]:
        assert 2 <= entry["repeats"] <= 4 and entry["repeats"] == len(entry["result"]["runs"])
        assert entry["result"]["stopped"] in ("decided", "max_repeats") and entry["round_s"] > 0
    assert record["stopped"] == "nothing left to try: input_bound (test)"
    tuned = record["tuned"]
    assert tuned["settings"] == together["tried"] and 0 < tuned["tuning_s"] <= record["elapsed_s"]
    linked = [r for r in store.list_runs(runs_dir) if (r.get("tune") or {}).get("id") == record["id"]]
    assert tuned["runs"] == len(linked) == 1 + sum(2 * e["repeats"] for e in record["rounds"])
    assert tuned["end"]["run"] in together["result"]["runs"]  # the newest run of the tuned config
    out = io.StringIO()
    print_tune(record, tmp_path / "tuned.yaml", out)
    shown = out.getvalue()
    assert f"3 round(s), {tuned['runs']} run(s)" in shown
    assert f"     {first['repeats']} run(s) a side; decided" in shown
    assert "the adopted changes together against the starting config" in shown and ": kept: " in shown


def test_max_repeats_below_repeats_is_refused_before_running(completed_run, tmp_path):
    proc = glmperf("tune", "--preset", "tiny", "--repeats", "3", "--max-repeats", "2", "--runs-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "glmperf: error: --max-repeats: got 2; allowed: at least --repeats (3)"
    proc = glmperf("recommend", str(completed_run), "--runs-dir", str(tmp_path), "--verify", "--max-repeats", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "glmperf: error: --max-repeats: got 2; allowed: at least --repeats (3)"
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="max_repeats: got 1"):
        TuneSpec(load_config(preset="tiny"), repeats=2, max_repeats=1)
    assert TuneSpec(load_config(preset="tiny"), repeats=8).most == 8
    assert TuneSpec(load_config(preset="tiny")).most == tune_module.DEFAULT_MAX_REPEATS == cli_tune.DEFAULT_MAX_REPEATS
