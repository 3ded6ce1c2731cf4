"""What-if probes: a change measured side by side with the run's config on its own model and machine.

The arithmetic is checked on recorded probes (a probe kept in the cache is a recorded measurement, and
the advice reads it exactly as it reads a fresh one); the measuring on real `small` and `tiny` runs:
a fp32 run made without a trace is advised bf16 with a measured range where the CPU has native bf16
(never where it has not), rerunning it agrees with the probe, asking again reuses the probe, and a
change a probe measured slower is dropped with its figures.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from profiler import store
from profiler.advice.advise import advise
from profiler.advice.measured import MIN_GAIN, ProbeBudget, contention, gain_from_probe, probe_advice
from profiler.advice.probes import MIN_ROUNDS, Probe, Prober, keep
from profiler.advice.recommend import explore
from profiler.advice.spread import PRIOR_DOF, PRIOR_SIGMA, Spread, record, run_to_run
from profiler.analysis import analyze, load_run
from profiler.analysis.figures import Figure
from profiler.metrics import PHASE_NAMES
from tests.conftest import cli, copy_run, glmperf


def _shares(**shares: float) -> dict[str, Figure]:
    return {f"share.{p}": Figure(shares.get(p, 0.0), "%", "test") for p in PHASE_NAMES}


def _phases(**seconds: float) -> dict[str, float]:
    return {p: seconds.get(p, 0.0) for p in PHASE_NAMES}


def _probe(base: dict[str, float], cand: dict[str, float], rounds: int = 8, **kw: object) -> Probe:
    return Probe(change={"switches.amp.dtype": "bf16"}, base=[_phases(**base)] * rounds,
                 cand=[_phases(**cand)] * rounds, cost_s=1.0, machine="test", threads=1, **kw)


def test_a_probed_gain_is_amdahl_over_the_run_s_own_breakdown() -> None:
    probe = _probe({"forward": 2e-6, "backward": 4e-6}, {"forward": 1e-6, "backward": 2e-6})  # compute x0.5
    # a run that spends 60% of its step waiting for data gains 1 / (0.6 + 0.4 x 0.5) - 1 = 25%
    waiting = gain_from_probe(probe, _shares(data=60, forward=20, backward=20))
    assert waiting["point"] == pytest.approx(25.0)
    # the same change on a run that only computes doubles it
    assert gain_from_probe(probe, _shares(forward=40, backward=60))["point"] == pytest.approx(100.0)


def test_a_phase_the_probe_hardly_spends_time_in_keeps_its_share() -> None:
    # the probe's optimizer is 0.1% of its step: its x10 is noise, and the run's 30% optimizer stays as it is
    probe = _probe({"forward": 1e-3, "optimizer": 1e-6}, {"forward": 1e-3, "optimizer": 1e-5})
    assert gain_from_probe(probe, _shares(forward=70, optimizer=30))["point"] == pytest.approx(0.0)


def test_the_interval_is_the_probe_s_own_noise() -> None:
    steady = _probe({"forward": 1.0}, {"forward": 0.5})
    noisy = Probe(change={}, base=[_phases(forward=1.0)] * 8,
                  cand=[_phases(forward=x) for x in (0.3, 0.7, 0.4, 0.6, 0.35, 0.65, 0.5, 0.5)])
    shares = _shares(forward=100)
    tight, wide = gain_from_probe(steady, shares), gain_from_probe(noisy, shares)
    assert tight["low"] == pytest.approx(100.0) and tight["high"] == pytest.approx(100.0)
    assert wide["low"] < 100.0 < wide["high"] and wide["high"] - wide["low"] > 30


def test_communication_one_process_cannot_time_stays_modelled_and_widens_the_range() -> None:
    probe = _probe({"forward": 1.0}, {"forward": 1.0})
    shares = _shares(forward=50, comm=50)
    gain = gain_from_probe(probe, shares, comm_ratio=(0.25, 0.75))  # the catalog: comm shrinks by 25-75%
    assert gain["low"] == pytest.approx(100 * (1 / (0.5 + 0.5 * 0.75) - 1))
    assert gain["high"] == pytest.approx(100 * (1 / (0.5 + 0.5 * 0.25) - 1))


def test_time_the_ranks_lost_beside_communication_may_stay_or_shrink_with_it() -> None:
    # the ranks' forward took 2 ms for 1000 tokens where one process takes 1 us a token: half of it is
    # time the ranks lost beside their communication
    probe = _probe({"forward": 1e-6}, {"forward": 1e-6})
    figures = {**_shares(forward=50, comm=50), "phase_ms.forward": Figure(2.0, "ms", "test"),
               "phase_ms.comm": Figure(2.0, "ms", "test")}
    assert contention(probe, figures, rank_tokens=1000) == pytest.approx(0.5)
    assert contention(probe, {**figures, "phase_ms.forward": Figure(0.5, "ms", "test")}, rank_tokens=1000) == 0.0
    gain = gain_from_probe(probe, figures, comm_ratio=(0.25, 0.25), contended=0.5)
    # it stays: 25% + 25% + 50% x 0.25 of the step; it shrinks with the communication: 25% + 6.25% + 12.5%
    assert gain["low"] == pytest.approx(100 * (1 / 0.625 - 1))
    assert gain["high"] == pytest.approx(100 * (1 / 0.4375 - 1))
    assert gain["low"] < gain["point"] < gain["high"]


def test_a_range_leaves_room_for_the_machine_s_run_to_run_spread() -> None:
    # a probe with no noise of its own halves the step: +100%; on a machine whose fresh runs spread by 3%
    # (sigma of log tokens/s), the next run against this one, and the probe's own process, add Z sqrt(3) 3%
    steady = _probe({"forward": 1.0}, {"forward": 0.5})
    gain = gain_from_probe(steady, _shares(forward=100), spread=0.03)
    extra = 1.645 * math.sqrt(3) * 0.03
    assert gain["point"] == pytest.approx(100.0)
    assert gain["low"] == pytest.approx(100 * (2 * math.exp(-extra) - 1))
    assert gain["high"] == pytest.approx(100 * (2 * math.exp(extra) - 1))


def test_recorded_verifications_widen_the_advice_and_say_so(completed_run: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path / "cache"))
    run = load_run(copy_run(completed_run, tmp_path / "runs"))
    change = advise(run)["recommendations"][0]["set"]
    prober = Prober(run.config, device=run.device, threads=int(run.rank(0)["torch_threads"]))
    keep(prober.key(change), _probe({"data": 2e-4, "forward": 1e-4}, {"data": 1e-5, "forward": 1e-4}))
    prober.close()
    alone = advise(run, probes=ProbeBudget(total_s=0.0))["recommendations"][0]["expected"]
    # no verification yet: the prior stands in, and the basis says it is assumed
    assert alone["run_to_run"]["tokens_per_s"] == {"sigma_pct": 100 * PRIOR_SIGMA, "runs": 0,
                                                   "prior_sigma_pct": 100 * PRIOR_SIGMA, "prior_dof": PRIOR_DOF}
    assert f"tokens_per_s {100 * PRIOR_SIGMA:.1f}% assumed (not measured on this machine yet" in alone["basis"]
    # two verifications' repeated runs of one config each, tokens/s as a verification stores them: their
    # 3 degrees of freedom pooled with the prior's
    record({"tokens_per_s": [[1000.0, 1040.0, 980.0], [500.0, 530.0]]}, run.device)
    logs = [[math.log(x) for x in g] for g in ([1000.0, 1040.0, 980.0], [500.0, 530.0])]
    squares = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in logs)
    sigma = math.sqrt((squares + PRIOR_DOF * PRIOR_SIGMA**2) / (3 + PRIOR_DOF))
    assert run_to_run("tokens_per_s", run.device) == Spread(pytest.approx(sigma), runs=5, groups=2)
    # many quiet runs outweigh the prior: the range narrows towards what they measured
    record({"tokens_per_s": [[1000.0, 1001.0, 999.0]] * 30}, run.device)
    quiet = run_to_run("tokens_per_s", run.device)
    assert quiet.sigma < sigma / 2 and quiet.runs == 95
    widened = advise(run, probes=ProbeBudget(total_s=0.0))["recommendations"][0]["expected"]
    tps, before = widened["tokens_per_s"], alone["tokens_per_s"]
    assert tps["point"] == pytest.approx(before["point"])
    assert tps["low"] > before["low"] and tps["high"] < before["high"]
    assert widened["run_to_run"]["tokens_per_s"]["runs"] == 95
    assert f"tokens_per_s {100 * quiet.sigma:.1f}% over 95 runs (with a 5% prior as 4 runs)" in widened["basis"]


@pytest.fixture(scope="module")
def fp32_small_no_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(the runs, the environment of the commands that read them: a probe cache of their own, which no earlier
    `small` run's end-probe has filled)."""
    runs = tmp_path_factory.mktemp("fp32")
    env = {**os.environ, "GLMPERF_CACHE": str(tmp_path_factory.mktemp("fp32-cache"))}
    # --probe-budget 0: recommend probes it itself (profile-run's own end-probe: tests/test_end_probe.py)
    proc = cli("--preset", "small", "--steps", "8", "--no-trace", "--set=profile.warmup_steps=2", "--name", "plain",
               "--probe-budget", "0", runs_dir=runs, env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return runs, env


def test_a_no_trace_fp32_run_gets_bf16_measured_where_the_cpu_runs_it_natively_verified_and_reused(
        fp32_small_no_trace: tuple[Path, dict[str, str]]) -> None:
    runs, env = fp32_small_no_trace
    # enough budget for bf16 whatever order the run's modelled ranges put the explored changes in
    # (up to 15 s each, compile last)
    started = time.perf_counter()
    out = glmperf("recommend", "plain", "--runs-dir", str(runs), "--json", "--probe-budget", "60", env=env)
    measuring_s = time.perf_counter() - started
    assert out.returncode == 0, out.stderr
    advice = json.loads(out.stdout)
    (run,) = store.list_runs(runs)
    native = run["diagnosis"]["figures"]["native_bf16"]["value"] == 1.0
    bf16 = [r for r in advice["recommendations"] if r["set"] == {"switches.amp.dtype": "bf16"}]
    if not native:  # emulated bf16 is never advised, measured or not
        assert not bf16
    else:
        (rec,) = bf16
        tps = rec["expected"]["tokens_per_s"]
        assert rec["expected"]["source"] == "measured" and tps["low"] > 0, rec["expected"]
        assert rec["expected"]["probe"]["rounds"] >= MIN_ROUNDS and not rec["expected"]["probe"]["cached"]
        # kept in run.json, where the report and the dashboard read it
        stored = store.read_run(Path(run["path"]))["diagnosis"]["recommendations"]
        assert [r["expected"]["source"] for r in stored if r["set"] == rec["set"]] == ["measured"]
        page = Path(run["path"]) / "measured.html"
        assert glmperf("report", "plain", "--runs-dir", str(runs), "-o", str(page), env=env).returncode == 0
        assert f"tokens/s {tps['low']:+.0f}% to {tps['high']:+.0f}% (measured)" in page.read_text()
        # rerunning it measures what the probe did: the verification's interval and the probe's overlap
        out = glmperf("recommend", "plain", "--runs-dir", str(runs), "--json", "--probe-budget", "1", "--verify",
                      "--top", "1", "--repeats", "2", "--steps", "12", "--no-progress", env=env)
        assert out.returncode == 0, out.stderr
        (result,) = json.loads(out.stdout)["verification"]["results"]
        assert result["set"] == rec["set"]
        m = result["measured"]
        assert m["low_pct"] <= tps["high"] and tps["low"] <= m["high_pct"], (tps, m)
    started = time.perf_counter()  # a budget too small to start a probe: what it has is the cache's
    again = json.loads(glmperf("recommend", "plain", "--runs-dir", str(runs), "--json", "--probe-budget", "1",
                               env=env).stdout)
    assert again["probes"]["measured"] == 0 and again["probes"]["cached"] == advice["probes"]["measured"] > 0
    measured = [r for r in again["recommendations"] if r["expected"]["source"] == "measured"]
    assert all(r["expected"]["probe"]["cached"] for r in measured)
    # and asked faster than when it measured them (one probe, stopped at 3 rounds, can cost less than the
    # start of the process that reads it)
    assert time.perf_counter() - started < measuring_s


def test_a_change_a_probe_measured_slower_is_dropped_with_its_figures(completed_run: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path / "cache"))
    run = load_run(copy_run(completed_run, tmp_path / "runs"))
    modelled = advise(run)["recommendations"][0]
    assert modelled["set"] == {"switches.dataloader.num_workers": 2}  # the fixture waits on its loader
    # a recorded probe of this change on this machine: the loader got slower (x2 the data wait)
    prober = Prober(run.config, device=run.device, threads=int(run.rank(0)["torch_threads"]))
    keep(prober.key(modelled["set"]), _probe({"data": 1e-4, "forward": 1e-4}, {"data": 2e-4, "forward": 1e-4},
                                             measured="recorded"))
    prober.close()
    advice = advise(run, probes=ProbeBudget(total_s=0.0))  # the cache only: nothing new is measured
    assert modelled["set"] not in [r["set"] for r in advice["recommendations"]]
    (dropped,) = [e for e in advice["excluded"] if e["set"] == modelled["set"]]
    assert dropped["reason"].startswith("measured on this machine: tokens/s -")
    assert "probe: 8 rounds" in dropped["reason"]
    first, *others = advice["probes"].pop("changes")
    assert advice["probes"] == {"budget_s": 0.0, "spent_s": 0.0, "measured": 0, "cached": 1}
    assert first == {"set": modelled["set"], "state": "cached", "rounds": 8, "cost_s": 1.0}
    assert all(c["state"] == "left" and c["why"] == "the probe budget was spent (--probe-budget)" for c in others)


def test_without_probes_every_range_says_it_is_modelled_and_how_to_measure_it(completed_run: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path / "cache"))
    out = glmperf("recommend", str(completed_run), "--probe-budget", "0")
    assert out.returncode == 0, out.stderr
    assert "(modelled)" in out.stdout and "(measured)" not in out.stdout
    assert f"`glmperf recommend {completed_run.name}` measures them on this machine" in out.stdout
    assert not (tmp_path / "cache" / "probes").exists()


EAGER = {"switches.attention.impl": "eager"}


def test_a_kernel_choice_no_model_predicts_is_advised_only_where_a_probe_measured_it(completed_run: Path,
                                                                                      tmp_path: Path) -> None:
    run = load_run(copy_run(completed_run, tmp_path / "runs"))
    # modelled: no gain, so never advised; a probe may try it
    (dropped,) = [e for e in explore(run)["excluded"] if e["set"] == EAGER]
    assert dropped["reason"].startswith("not modelled: which kernel wins depends on the device")
    assert EAGER in [r["set"] for r in explore(run, probing=True)["recommendations"]]


def test_tune_verifies_an_explored_change_on_its_probed_point_advice_wants_the_whole_interval(
        completed_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLMPERF_CACHE", str(tmp_path / "cache"))
    run = load_run(copy_run(completed_run, tmp_path / "runs"))
    explored = {**explore(run, probing=True), "explored": True}
    explored["recommendations"] = [r for r in explored["recommendations"] if r["set"] == EAGER]
    # a recorded probe of eager attention: forward and backward x0.6 in most rounds, the odd round slower, so the
    # point is a gain and the interval's low end is not
    ratios = [0.6, 0.6, 0.6, 1.2, 0.6, 1.2, 0.6, 0.6]
    prober = Prober(run.config, device=run.device, threads=int(run.rank(0)["torch_threads"]))
    keep(prober.key(EAGER), Probe(change=EAGER, base=[_phases(forward=1e-4, backward=2e-4)] * 8,
                                  cand=[_phases(forward=1e-4 * r, backward=2e-4 * r) for r in ratios], cost_s=1.0,
                                  machine="test", threads=1))
    prober.close()
    figures, cache_only = analyze(run), ProbeBudget(total_s=0.0)
    advised = probe_advice(run, explored, figures, cache_only)
    (refused,) = [e for e in advised["excluded"] if e["set"] == EAGER]
    assert refused["reason"].startswith("measured on this machine: tokens/s +")
    assert not advised["recommendations"]
    (tried,) = probe_advice(run, explored, figures, cache_only, to_verify=True)["recommendations"]
    tps = tried["expected"]["tokens_per_s"]
    assert tried["set"] == EAGER and tps["low"] < MIN_GAIN < tps["point"], tps
