"""The alert rules and the dashboard, checked against the series the service really exports.

A `SinkService`'s registry is driven through the driver's own code paths (assignment, lag,
commits, task outcome rows as tasks encode them, repeated failures, the /metrics handler) and
scraped in the exposition format. Then:
- every metric and label the rules and the dashboard use must be in that scrape (or be a label
  Prometheus adds to a target);
- `promtool test rules` (Debian's `prometheus` package; skipped where it is not installed) evaluates
  the rules on series named and labelled as in the scrape: a partition that never committed since
  a restart fires SinkNoCommit, tombstones skipped on purpose do not fire SinkBadRecords, and each
  health alert fires on what it watches.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sink_service.config import load_config
from sink_service.driver.service import SinkService
from sink_service.task.partition_task import _Outcome
from tests.unit.test_deploy import (
    EXTERNAL_METRICS,
    alert_rules,
    dashboard,
    dashboard_exprs,
    k8s_objects,
    promql_metric_names,
)

# Labels Prometheus adds to every series of a Kubernetes target (ServiceMonitor relabelling).
TARGET_LABELS = {"job", "namespace", "pod", "instance", "service", "container", "endpoint"}
EXTERNAL_LABELS = {"up": set(), "kube_pod_status_ready": {"condition", "uid"}}
TARGET = {"job": "kafka-parquet-sink", "namespace": "sinks", "pod": "kafka-parquet-sink-0",
          "instance": "10.0.0.7:8080"}
ENV = {"SINK_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "SINK_TOPICS": "orders", "SINK_GROUP_ID": "g",
       "SINK_TARGET": "dir", "SINK_DIR_PATH": "/tmp/unused"}


def outcome_row(**fields) -> SimpleNamespace:
    """A task's outcome row, encoded the way tasks send it to the driver (`_Outcome.to_batch`)."""
    batch = _Outcome(topic="orders", partition=0, range_start=0, range_end=100, committable=100, **fields).to_batch()
    return SimpleNamespace(**batch.to_pylist()[0])


@cache
def scrape() -> dict[str, set[str]]:
    """Sample name -> label names, from the /metrics body of a service driven through its code paths."""
    service = SinkService(load_config(ENV), versions={"service": "0.1.0"})
    m = service.metrics
    tp = ("orders", 0)
    m.keep_partitions({tp})  # the query starts on its assignment
    m.assigned_partitions.set(1)  # what the group membership's on_change sets
    m.record_lag({tp: 0}, {tp: 500})
    m.record_outcome(outcome_row(
        records_read=100, records_written=90, records_uploaded=80, failure_class="retryable",
        bad_reasons={"tombstone": 3, "invalid_json": 2}, dead_letters={"invalid_json": 2},
        retries={"http_503": 1},
        files=[{"parked": "", "bytes": 1000, "duration_s": 0.2, "records": 80},
               {"parked": "http_400", "bytes": 10, "duration_s": 0.1, "records": 10}]), "ems", {})
    m.record_repeated_failures({tp: 2})
    m.batch_duration.observe(1.0)
    m.batches.labels("ok").inc()
    m.record_commits({tp: 100})
    with tempfile.TemporaryDirectory() as scratch:  # the planner's pending state, as it writes it
        state = Path(scratch) / "pending.json"
        state.write_text(json.dumps({"partitions": {"orders:0": [5, time.time() - 3]}}))
        m.record_admission(state)
    body, _ = service._metrics_exposition()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


# --- names and labels ------------------------------------------------------------------------------

_SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def label_problems(expr: str) -> list[str]:
    """Labels an expression matches or groups on that none of the series it selects has."""
    exported = scrape()
    names = promql_metric_names(expr)
    available = set(TARGET_LABELS)
    for name in names:
        available |= exported.get(name, set()) | EXTERNAL_LABELS.get(name, set())
    problems = []
    for name, matchers in _SELECTOR.findall(expr):
        have = exported.get(name, set()) | EXTERNAL_LABELS.get(name, set()) | TARGET_LABELS
        problems += [f"{name} has no label {label}" for label in _MATCHER.findall(matchers) if label not in have]
    for group in _GROUPING.findall(expr):
        for label in filter(None, (part.strip() for part in group.split(","))):
            if label not in available:
                problems.append(f"no series in the expression has label {label}")
    return problems


def test_every_alert_metric_and_label_is_in_a_scrape():
    for rule in alert_rules():
        unknown = promql_metric_names(rule["expr"]) - set(scrape()) - EXTERNAL_METRICS
        assert not unknown, f"{rule['alert']}: not exported: {sorted(unknown)}"
        assert not label_problems(rule["expr"]), (rule["alert"], label_problems(rule["expr"]))


def test_every_dashboard_metric_and_label_is_in_a_scrape():
    exprs = dashboard_exprs() + [json.dumps(v.get("query", "")) for v in dashboard()["templating"]["list"]
                                 if v["type"] == "query"]
    for expr in exprs:
        expr = expr.replace("\\", "")
        for metric in re.findall(r"label_values\(\s*([\w:]+)", expr):
            assert metric in scrape(), expr
        if "label_values" in expr:
            continue
        unknown = promql_metric_names(expr) - set(scrape()) - EXTERNAL_METRICS
        assert not unknown, f"{expr}: not exported: {sorted(unknown)}"
        assert not label_problems(expr), (expr, label_problems(expr))


def test_label_check_catches_a_wrong_label():
    assert label_problems('sum by (topic) (sink_bad_records_total{reason!="tombstone"})') == []
    assert label_problems('sum by (partition) (sink_bad_records_total)')
    assert label_problems('sink_ready{topic="x"}')


def test_the_scrape_has_process_and_memory_series():
    for name in ("process_resident_memory_bytes", "process_start_time_seconds", "python_info",
                 "sink_process_tree_resident_memory_bytes", "sink_partition_assigned_timestamp_seconds"):
        assert name in scrape(), name


def test_health_alerts_and_panels_exist():
    alerts = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    used = set().union(*(promql_metric_names(e) for e in dashboard_exprs()))
    for metric in ("sink_parked_files_total", "sink_dead_letters_total", "sink_repeated_failures", "sink_ready",
                   "sink_assigned_partitions", "sink_upload_oldest_inflight_age_seconds",
                   "sink_process_tree_resident_memory_bytes"):
        assert any(metric in expr for expr in alerts.values()), f"no alert on {metric}"
        assert metric in used, f"no panel for {metric}"


def test_dashboard_separates_deployments():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for name in ("namespace", "job"):
        assert variables[name]["type"] == "query"
        assert not variables[name].get("multi") and not variables[name].get("includeAll"), name
    for expr in dashboard_exprs():
        for _name, matchers in _SELECTOR.findall(expr):
            assert 'namespace="$namespace"' in matchers and 'job="$job"' in matchers, expr
        assert set(promql_metric_names(expr)) == {n for n, _ in _SELECTOR.findall(expr)}, \
            f"a selector without the deployment matchers: {expr}"


# --- rules evaluated by promtool -------------------------------------------------------------------

# scripts/bootstrap.sh puts promtool in .venv/bin wherever apt-get is (from Debian's prometheus package).
PROMTOOL = shutil.which("promtool") or shutil.which("promtool", path=str(Path(__file__).parents[2] / ".venv" / "bin"))
# CI (`.ci/run` sets CI=true) must evaluate the rules: a skip there would pass rules that cannot fire.
# Elsewhere, on a machine without apt-get, the tests skip and say how to get promtool.
needs_promtool = pytest.mark.skipif(
    not PROMTOOL and os.environ.get("CI") != "true",
    reason="promtool not installed (Debian: apt-get install --no-install-recommends prometheus)")


def series(name: str, values: str, pod: str = TARGET["pod"], **labels: str) -> dict:
    """One input series, labelled as the service exports it plus the target labels."""
    exported = scrape()[name]
    assert set(labels) <= exported, f"{name} is not exported with {set(labels) - exported}"
    assert exported - {"le"} <= set(labels), f"{name} is exported with {exported - set(labels)} too"
    text = ",".join(f'{k}="{v}"' for k, v in sorted({**TARGET, "pod": pod, **labels}.items()))
    return {"series": f"{name}{{{text}}}", "values": values}


TP = {"topic": "orders", "partition": "0"}
KEY = {"namespace": TARGET["namespace"], "job": TARGET["job"]}


def alert(name: str, at: str, *expected: dict) -> dict:
    severity = {rule["alert"]: rule["labels"]["severity"] for rule in alert_rules()}[name]
    return {"eval_time": at, "alertname": name,
            "exp_alerts": [{"exp_labels": {**labels, "severity": severity}} for labels in expected]}


def promtool_cases() -> list[dict]:
    """(input series, expected alerts) scenarios; minutes from 0, timestamps in seconds from 0."""
    return [
        {  # a restart straight into an endpoint outage: assigned at 0, lag waiting, never a commit
            "input_series": [series("sink_partition_assigned_timestamp_seconds", "0x40", **TP),
                             series("sink_consumer_lag_records", "500x40", **TP)],
            "alert_rule_test": [alert("SinkNoCommit", "12m"), alert("SinkNoCommit", "20m", {**KEY, **TP})]},
        {  # healthy: commits every minute
            "input_series": [series("sink_partition_assigned_timestamp_seconds", "0x40", **TP),
                             series("sink_last_commit_timestamp_seconds", "0+60x40", **TP),
                             series("sink_consumer_lag_records", "500x40", **TP)],
            "alert_rule_test": [alert("SinkNoCommit", "30m")]},
        {  # committed once, then stuck
            "input_series": [series("sink_partition_assigned_timestamp_seconds", "0x40", **TP),
                             series("sink_last_commit_timestamp_seconds", "60x40", **TP),
                             series("sink_consumer_lag_records", "500x40", **TP)],
            "alert_rule_test": [alert("SinkNoCommit", "20m", {**KEY, **TP})]},
        {  # crash loop in place: each start re-assigns, none commits
            "input_series": [series("sink_partition_assigned_timestamp_seconds",
                                    " ".join(f"{300 * i}x3 stale" for i in range(8)), **TP),
                             series("sink_consumer_lag_records", " ".join("500x3 stale" for _ in range(8)), **TP)],
            "alert_rule_test": [alert("SinkNoCommit", "25m", {**KEY, **TP})]},
        {  # idle and fully committed: nothing waiting
            "input_series": [series("sink_partition_assigned_timestamp_seconds", "0x40", **TP),
                             series("sink_consumer_lag_records", "0x40", **TP)],
            "alert_rule_test": [alert("SinkNoCommit", "30m")]},
        {  # tombstones skipped on purpose are not bad records to page about; invalid JSON is
            "input_series": [series("sink_bad_records_total", "0+5x20", topic="orders", reason="tombstone"),
                             series("sink_bad_records_total", "0x5 1+1x15", topic="orders", reason="invalid_json")],
            "alert_rule_test": [alert("SinkBadRecords", "4m"),
                                alert("SinkBadRecords", "10m", {**KEY, "topic": "orders", "reason": "invalid_json"})]},
        {  # bad records that reached the dead-letter topic: SinkDeadLetters, not SinkBadRecords too
            "input_series": [series("sink_bad_records_total", "0+2x20", topic="orders", reason="invalid_json"),
                             series("sink_dead_letters_total", "0+2x20", topic="orders", reason="invalid_json")],
            "alert_rule_test": [alert("SinkBadRecords", "10m"),
                                alert("SinkDeadLetters", "10m", {**KEY, "topic": "orders", "reason": "invalid_json"})]},
        {
            "input_series": [series("sink_parked_files_total", "0 0 1x10", topic="orders", reason="http_400")],
            "alert_rule_test": [alert("SinkFilesParked", "5m", {**KEY, "topic": "orders", "reason": "http_400"})]},
        {
            "input_series": [series("sink_repeated_failures", "0 2x20", **TP)],
            "alert_rule_test": [alert("SinkRepeatedFailures", "10m", {**KEY, **TP})]},
        {
            "input_series": [series("sink_ready", "1 0x30")],
            "alert_rule_test": [alert("SinkNotReady", "5m"),
                                alert("SinkNotReady", "15m", {**KEY, "pod": TARGET["pod"]})]},
        {
            "input_series": [series("sink_assigned_partitions", "0x30")],
            "alert_rule_test": [alert("SinkNoPartitionsAssigned", "20m", KEY)]},
        {  # one replica of two has partitions: fine
            "input_series": [series("sink_assigned_partitions", "0x30"),
                             series("sink_assigned_partitions", "3x30", pod="kafka-parquet-sink-1")],
            "alert_rule_test": [alert("SinkNoPartitionsAssigned", "20m")]},
        {
            "input_series": [series("sink_upload_oldest_inflight_age_seconds", "0+60x30")],
            "alert_rule_test": [alert("SinkUploadStuck", "5m"),
                                alert("SinkUploadStuck", "15m", {**KEY, "pod": TARGET["pod"]})]},
        {
            "input_series": [series("sink_process_tree_resident_memory_bytes", "2e9x30")],
            "alert_rule_test": [alert("SinkMemoryHigh", "20m", {**KEY, "pod": TARGET["pod"]})]},
    ]


def rule_groups(annotations: bool) -> dict:
    groups = json.loads(json.dumps(k8s_objects()["PrometheusRule"]["spec"]["groups"]))
    if not annotations:  # promtool compares annotations too; these tests are about when alerts fire
        for group in groups:
            for rule in group["rules"]:
                rule.pop("annotations", None)
    return {"groups": groups}


@needs_promtool
def test_promtool_checks_the_rules(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(annotations=True)))
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_parses_the_dashboard_queries(tmp_path):
    """Each panel query as a recording rule, Grafana's variables replaced: promtool parses them all."""
    substitutions = {"$__rate_interval": "5m", "$__interval": "1m", "$namespace": "sinks",
                     "$job": "kafka-parquet-sink", "$topic": ".*"}
    rules = []
    for i, expr in enumerate(dashboard_exprs()):
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:panel_{i}", "expr": expr})
    path = tmp_path / "dashboard.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_evaluates_the_alerts_on_exported_series(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(annotations=False)))
    cases = [{"interval": "1m", **case} for case in promtool_cases()]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": cases}))
    result = subprocess.run([PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
