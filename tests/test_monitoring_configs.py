"""The monitoring configuration of configs/monitoring/ (docs/monitoring.md) against the real promtool:
the rule file and the scrape config pass `promtool check`; `promtool test rules` runs each alert on
series that must fire it (with its labels) and on healthy, NaN-laden and neighbouring series that must
not; the alerts, the Grafana dashboard and the docs' metric table name exactly the exporter's metrics.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "configs" / "monitoring"
ALERTS = MONITORING / "alerts.yml"
PROMETHEUS = MONITORING / "prometheus.yml"
DASHBOARD = MONITORING / "grafana" / "glmperf.json"
DOCS = ROOT / "docs" / "monitoring.md"
PROMTOOL = Path("/usr/bin/promtool")
NAME = re.compile(r"glmperf_[a-z_]+")

needs_promtool = pytest.mark.skipif(not PROMTOOL.exists(),
                                    reason=f"no promtool at {PROMTOOL} (apt-get install prometheus)")

BASE = {"job": "glmperf", "instance": "node01:9400", "run_id": "r1", "run_name": "demo", "rank": "0",
        "host": "node01"}
"""The labels of one rank's series as Prometheus stores them: the job's own four and the target's."""
KINDS = ("non_finite", "loss_spike", "loss_plateau", "rollback")


# -- helpers ---------------------------------------------------------------------------------------
def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROMTOOL), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=ROOT)


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def severity(alert: str) -> str:
    return next(r["labels"]["severity"] for r in rules() if r["alert"] == alert)


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in {**BASE, **labels}.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def nan(n: int) -> str:
    """n NaN samples (promtool's notation has no `NaNxN`)."""
    return " ".join(["NaN"] * n)


def step_series(minutes: int, per_minute: int = 5) -> list[dict[str, str]]:
    """A job finishing `per_minute` steps a minute, its target up."""
    return [series("glmperf_steps_total", f"0+{per_minute}x{minutes}"),
            series("glmperf_last_step", f"0+{per_minute}x{minutes}"),
            {"series": 'up{job="glmperf", instance="node01:9400"}', "values": f"1x{minutes}"}]


def quiet_events(minutes: int) -> list[dict[str, str]]:
    return [series("glmperf_stability_events_total", f"0x{minutes}", kind=k) for k in KINDS]


def wobble(start: float, slope: float, amplitude: float, n: int) -> str:
    """A slowly falling, noisy curve (a healthy loss or grad norm), one sample a minute."""
    return " ".join(f"{start + slope * i + amplitude * ((i * 7) % 5 - 2) / 2:.4f}" for i in range(n))


def fires(alert: str, at: str, **labels: str) -> list[dict[str, Any]]:
    return [{"eval_time": at, "alertname": alert,
             "exp_alerts": [{"exp_labels": {**BASE, **labels, "severity": severity(alert)}}]}]


def quiet(alert: str, *times: str) -> list[dict[str, Any]]:
    return [{"eval_time": at, "alertname": alert, "exp_alerts": []} for at in times]


def all_quiet(*times: str) -> list[dict[str, Any]]:
    return [case for rule in rules() for case in quiet(rule["alert"], *times)]


# -- the scenarios: (name, input series, alert tests) -----------------------------------------------
def scenarios() -> list[tuple[str, list[dict[str, str]], list[dict[str, Any]]]]:
    healthy = [*step_series(60), *quiet_events(60),
               series("glmperf_step_seconds", "1x60"),
               series("glmperf_data_wait_ratio", "0.02x60"),
               series("glmperf_loss", wobble(3.0, -0.01, 0.05, 61)),
               series("glmperf_grad_norm", wobble(2.0, -0.01, 0.3, 61)),
               series("glmperf_loss_non_finite", "0x60"),
               series("glmperf_skipped_steps_total", "0x20 1x40"),  # one fp16 overflow
               series("glmperf_comm_exposed_seconds", "0.02x60"),
               series("glmperf_comm_seconds", "0.3x60", collective="all_reduce"),
               series("glmperf_collective_latency_seconds", "0.01x60", collective="all_reduce"),
               series("glmperf_gpu_utilization_ratio", "0.9x60", device="0")]
    # a user loop (api.run, the HF/Lightning callbacks) on CPU: no grad norm, no data wait, no GPU; its
    # grad norm is NaN on every step, so the non-finite gauge may read 1 on every step
    user_loop = [*step_series(60), *quiet_events(60),
                 series("glmperf_step_seconds", "1x60"),
                 series("glmperf_data_wait_ratio", nan(61)),
                 series("glmperf_mfu_ratio", nan(61)),
                 series("glmperf_loss", wobble(3.0, -0.01, 0.05, 61)),
                 series("glmperf_grad_norm", nan(61)),
                 series("glmperf_loss_non_finite", "1x60"),
                 series("glmperf_skipped_steps_total", "0x60"),
                 series("glmperf_comm_exposed_seconds", "0x60"),
                 series("glmperf_memory_peak_bytes", nan(61))]
    stalled_steps = [series("glmperf_steps_total", "1+1x19 20x30"), series("glmperf_last_step", "0+1x19 19x30")]
    return [
        ("a healthy GPU run: no alert at all", healthy, all_quiet("10m", "30m", "45m", "60m")),
        ("a healthy user loop on CPU (NaN grad norm, data wait, MFU): no alert at all", user_loop,
         all_quiet("10m", "30m", "60m")),

        ("GPU utilization 0.3 while steps advance", [*step_series(20),
                                                     series("glmperf_gpu_utilization_ratio", "0.3x20", device="0")],
         [*quiet("GlmperfLowGpuUtilization", "3m"), *fires("GlmperfLowGpuUtilization", "15m", device="0")]),
        ("GPU utilization 0.1 of a stalled job: the stall's alert, not this one",
         [series("glmperf_steps_total", "5x20"), series("glmperf_gpu_utilization_ratio", "0.1x20", device="0")],
         quiet("GlmperfLowGpuUtilization", "15m")),
        ("GPU utilization NaN", [*step_series(20), series("glmperf_gpu_utilization_ratio", nan(21), device="0")],
         quiet("GlmperfLowGpuUtilization", "15m")),

        ("data wait 30% of the step", [series("glmperf_data_wait_ratio", "0.3x30")],
         [*quiet("GlmperfInputBound", "5m"), *fires("GlmperfInputBound", "20m")]),
        ("data wait not measured (NaN)", [series("glmperf_data_wait_ratio", nan(31))],
         quiet("GlmperfInputBound", "20m")),

        ("exposed communication 30% of the step", [series("glmperf_comm_exposed_seconds", "0.3x30"),
                                                   series("glmperf_step_seconds", "1x30")],
         fires("GlmperfCommBound", "20m")),
        ("a step time of 0 or NaN gives no ratio",
         [series("glmperf_comm_exposed_seconds", "0x30"), series("glmperf_step_seconds", "0x30"),
          series("glmperf_comm_exposed_seconds", "0.3x30", rank="1"),
          series("glmperf_step_seconds", nan(31), rank="1"),
          series("glmperf_comm_exposed_seconds", "0.01x30", rank="2"),
          series("glmperf_step_seconds", "0x30", rank="2")],
         quiet("GlmperfCommBound", "20m")),

        ("all-reduce 80 ms a call", [series("glmperf_collective_latency_seconds", "0.08x20", collective="all_reduce")],
         fires("GlmperfSlowAllReduce", "15m", collective="all_reduce")),
        ("a slow all-gather is not an all-reduce",
         [series("glmperf_collective_latency_seconds", "0.2x20", collective="all_gather")],
         quiet("GlmperfSlowAllReduce", "15m")),

        ("no step for 25 minutes, target up", [*stalled_steps, {"series": 'up{job="glmperf", instance="node01:9400"}',
                                                                "values": "1x50"}],
         [*quiet("GlmperfStepsStalled", "30m"), *fires("GlmperfStepsStalled", "45m")]),
        ("loading for 40 minutes before the first step",
         [series("glmperf_steps_total", "0x40"), {"series": 'up{job="glmperf", instance="node01:9400"}',
                                                  "values": "1x40"}],
         quiet("GlmperfStepsStalled", "40m")),
        ("the target went down at minute 21: down, not stalled",
         [*stalled_steps, {"series": 'up{job="glmperf", instance="node01:9400"}', "values": "1x20 0x30"}],
         [*quiet("GlmperfStepsStalled", "45m"), *fires("GlmperfTargetDown", "45m")]),

        ("the target stopped answering at minute 31", [series("glmperf_steps_total", "0+5x30 _x30"),
                                                       {"series": 'up{job="glmperf", instance="node01:9400"}',
                                                        "values": "1x30 0x69"}],
         [*quiet("GlmperfTargetDown", "31m"), *fires("GlmperfTargetDown", "40m"),
          *quiet("GlmperfTargetDown", "95m")]),  # an hour after its last series
        ("a target that never served a run", [{"series": 'up{job="glmperf", instance="node09:9400"}',
                                               "values": "0x40"}],
         quiet("GlmperfTargetDown", "40m")),

        ("the loss turns NaN at minute 21: non-finite only, not a plateau nor a grad-norm spike",
         [*step_series(40), series("glmperf_loss", f"2.5x20 {nan(20)}"),
          series("glmperf_grad_norm", f"1x20 {nan(20)}"), series("glmperf_loss_non_finite", "0x20 1x20")],
         [*quiet("GlmperfLossNonFinite", "20m"), *fires("GlmperfLossNonFinite", "35m"),
          *quiet("GlmperfLossStagnation", "35m", "40m"), *quiet("GlmperfGradNormExplosion", "25m", "35m")]),
        ("the grad norm turns NaN, the loss stays finite",
         [series("glmperf_loss", "3-0.01x40"), series("glmperf_grad_norm", f"1x20 {nan(20)}"),
          series("glmperf_loss_non_finite", "0x20 1x20")],
         fires("GlmperfLossNonFinite", "30m")),
        ("the NaN guard skips non-finite steps (events)",
         [series("glmperf_loss", "3-0.01x30"), series("glmperf_loss_non_finite", "0x30"),
          series("glmperf_stability_events_total", "0x10 1+1x20", kind="non_finite")],
         fires("GlmperfLossNonFinite", "15m")),
        ("one NaN step, then finite again",
         [series("glmperf_loss", "3-0.01x20 NaN 2.79-0.01x19"), series("glmperf_grad_norm", "1x40"),
          series("glmperf_loss_non_finite", "0x20 1 0x19")],
         quiet("GlmperfLossNonFinite", "21m", "22m", "23m", "30m")),

        ("the grad norm jumps to 50x", [series("glmperf_grad_norm", "1x40 50x5")],
         [*quiet("GlmperfGradNormExplosion", "40m"), *fires("GlmperfGradNormExplosion", "45m")]),
        ("the grad norm goes NaN, then Inf (fp16 overflow)",
         [series("glmperf_grad_norm", f"1x40 {nan(5)} Inf Inf Inf Inf Inf")],
         quiet("GlmperfGradNormExplosion", "44m", "50m")),
        ("the grad norm falls fast early in training", [series("glmperf_grad_norm", "40-1x38 1x10")],
         quiet("GlmperfGradNormExplosion", "10m", "30m", "45m")),

        ("the loss stays at 2.5 while steps advance", [*step_series(40, per_minute=2),
                                                       series("glmperf_loss", "2.5x40")],
         fires("GlmperfLossStagnation", "40m")),
        ("loss_plateau events of a noisy loss that still falls",
         [*step_series(40), series("glmperf_loss", wobble(3.0, -0.01, 0.05, 41)),
          series("glmperf_stability_events_total", "0+1x40", kind="loss_plateau")],
         quiet("GlmperfLossStagnation", "20m", "40m")),
        ("a stalled job's loss does not move: the stall's alert, not this one",
         [series("glmperf_steps_total", "100x40"), series("glmperf_loss", "2.5x40")],
         quiet("GlmperfLossStagnation", "40m")),

        ("a rollback", [*quiet_events(30)[:3],
                        series("glmperf_stability_events_total", "0x10 1x20", kind="rollback")],
         fires("GlmperfRollback", "15m", kind="rollback")),
        ("a loss spike", [series("glmperf_stability_events_total", "0x10 1x20", kind="loss_spike")],
         fires("GlmperfLossSpike", "15m", kind="loss_spike")),
        ("30% of the steps skip their update", [series("glmperf_steps_total", "0+10x30"),
                                                series("glmperf_skipped_steps_total", "0+3x30")],
         fires("GlmperfManySkippedSteps", "25m")),
    ]


def unit_tests(rule_file: Path) -> dict[str, Any]:
    return {"rule_files": [str(rule_file)], "evaluation_interval": "1m",
            "tests": [{"name": name, "interval": "1m", "input_series": input_series, "alert_rule_test": cases}
                      for name, input_series, cases in scenarios()]}


# -- promtool --------------------------------------------------------------------------------------
@needs_promtool
def test_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


@needs_promtool
def test_scrape_config_passes_promtool_check() -> None:
    done = promtool("check", "config", PROMETHEUS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout  # alerts.yml, found beside the config
    config = yaml.safe_load(PROMETHEUS.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "glmperf")
    assert job["honor_labels"] is True and job["static_configs"][0]["targets"]
    assert "file_sd_configs" in PROMETHEUS.read_text()  # the commented example for many ranks


@needs_promtool
def test_each_alert_fires_on_its_series_and_stays_quiet_on_healthy_ones(tmp_path: Path) -> None:
    """Annotations are left out of the copy promtool tests (it compares them too); the real file's
    templates are rendered in the next test."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations")
    rule_file = tmp_path / "alerts.yml"
    rule_file.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(unit_tests(rule_file), sort_keys=False, width=1000))
    done = promtool("test", "rules", test_file)
    assert done.returncode == 0, done.stdout + done.stderr

    cases = [case for _, _, tests in scenarios() for case in tests]
    for rule in rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: no series shown to fire it"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']}: no series shown to leave it quiet"


@needs_promtool
def test_annotations_render_with_run_rank_and_value(tmp_path: Path) -> None:
    rule = next(r for r in rules() if r["alert"] == "GlmperfInputBound")
    test_file = tmp_path / "annotations_test.yml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": [str(ALERTS)], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [series("glmperf_data_wait_ratio", "0.3x30")],
                   "alert_rule_test": [{**fires("GlmperfInputBound", "20m")[0], "exp_alerts": [{
                       "exp_labels": {**BASE, "severity": "warning"},
                       "exp_annotations": {"summary": "demo rank 0: waiting for data 30% of the step (over 10%)",
                                           "description": rule["annotations"]["description"]}}]}]}]},
        sort_keys=False))
    done = promtool("test", "rules", test_file)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_says_who_what_and_what_next() -> None:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert [g["name"] for g in groups] == ["glmperf"]
    for rule in rules():
        assert re.fullmatch(r"Glmperf[A-Za-z]+", rule["alert"]), rule["alert"]
        assert re.fullmatch(r"\d+m", rule["for"]), f"{rule['alert']}: for {rule['for']!r}"
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
        for needed in ("$labels.run_name", "$labels.rank", "$value"):
            assert needed in summary, f"{rule['alert']}: the summary lacks {needed}"
        assert re.search(r"glmperf (diagnose|recommend|show)", description), rule["alert"]


# -- the names: alerts, dashboard and docs against the exporter -----------------------------------
def dashboard_expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return queries + [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def test_alerts_and_dashboard_use_only_served_metrics() -> None:
    from profiler.instruments.prometheus import METRIC_NAMES

    in_alerts = {n for rule in rules() for text in (rule["expr"], *rule["annotations"].values())
                 for n in NAME.findall(text)}
    in_dashboard = {n for expr in dashboard_expressions() for n in NAME.findall(expr)}
    assert in_alerts - set(METRIC_NAMES) == set()
    assert in_dashboard - set(METRIC_NAMES) == set()
    assert set(METRIC_NAMES) - in_dashboard == set(), "metrics the dashboard does not show"


def test_docs_table_lists_every_metric() -> None:
    from profiler.instruments.prometheus import METRIC_NAMES

    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `glmperf_")]
    in_table = {NAME.findall(row.split("|")[1])[0] for row in rows}
    assert set(METRIC_NAMES) - in_table == set(), "metrics missing from docs/monitoring.md's table"
    assert in_table - set(METRIC_NAMES) == set(), "docs/monitoring.md's table lists metrics not served"


# -- the Grafana dashboard -------------------------------------------------------------------------
def test_dashboard_loads_with_unique_ids_and_a_query_per_panel() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 36 and board["uid"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("run_name", "rank"):
        assert variables[name]["query"].startswith("label_values(") and name in variables[name]["query"]
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in panels:
        if panel["type"] == "row":  # a section heading, no data
            continue
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'run_name=~"$run_name"' in target["expr"] and 'rank=~"$rank"' in target["expr"], panel["title"]


@needs_promtool
def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Each query, with Grafana's variables filled in, as a recording rule promtool parses."""
    exprs = [e.replace("$__rate_interval", "1m").replace("$run_name", ".*").replace("$rank", ".*")
             for e in dashboard_expressions() if not e.startswith("label_values(")]
    rule_file = tmp_path / "dashboard_queries.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    done = promtool("check", "rules", rule_file)
    assert done.returncode == 0, done.stdout + done.stderr


def test_grafana_provisioning_points_at_the_dashboard() -> None:
    provider = yaml.safe_load((MONITORING / "grafana" / "provisioning.yml").read_text())["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    source = yaml.safe_load((MONITORING / "grafana" / "datasource.yml").read_text())["datasources"][0]
    assert source["type"] == "prometheus" and source["url"].startswith("http")
