"""Static checks of the Dockerfile and everything under deploy/ (no Docker, no cluster, no network).

The deployment files name settings, metrics, ports and paths that the code defines; these tests
fail when the two drift apart.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from sink_service.config import KAFKA_PASSTHROUGH_PREFIX, ConfigError, declared_fields, load_config
from sink_service.driver.metrics import SinkMetrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DASHBOARD = DEPLOY / "grafana" / "sink-dashboard.json"
COMPOSE = DEPLOY / "docker-compose.yml"
DEPLOY_README = DEPLOY / "README.md"
ENTRYPOINT = DEPLOY / "image" / "entrypoint.sh"
ENTRYPOINT_IN_IMAGE = "/usr/local/bin/sink-entrypoint"
APP = "kafka-parquet-sink"

# Metrics the alerts may use that other exporters provide (Prometheus itself, kube-state-metrics).
EXTERNAL_METRICS = {"up", "kube_pod_status_ready"}
# librdkafka properties the deployment files pass through as SINK_KAFKA_<NAME>. Extend when adding
# one; the explicit list catches typos that would otherwise be passed through silently.
KNOWN_LIBRDKAFKA_PROPERTIES = {
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "client.id", "socket.timeout.ms", "session.timeout.ms",
}
RESERVED_KAFKA_PROPERTIES = {"bootstrap.servers", "group.id", "enable.auto.commit"}
REQUIRED_ALERTS = {
    "SinkConsumerLagGrowing", "SinkUploadsFailing", "SinkNoCommit", "SinkBadRecords", "SinkNotReady", "SinkDown",
    "SinkDeadLetters", "SinkFilesParked", "SinkRepeatedFailures", "SinkNoPartitionsAssigned", "SinkUploadStuck",
    "SinkMemoryHigh",
}


# --- helpers --------------------------------------------------------------------------------------

def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


@cache
def k8s_objects() -> dict[str, dict]:
    """Kind -> object, for the single-object manifests under deploy/kubernetes."""
    objects: dict[str, dict] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_yaml_docs(path):
            kind = doc["kind"]
            assert kind not in objects, f"two {kind} objects; the tests expect one of each"
            objects[kind] = doc
    return objects


def declared_envs() -> set[str]:
    return {f.metadata["env"] for f in declared_fields()}


@cache
def known_sample_names() -> frozenset[str]:
    """Every series name the service's registry can expose, as PromQL sees it."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",)}
    names: set[str] = set()
    for family in SinkMetrics().registry.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return frozenset(names)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$:])([a-zA-Z_:][\w:]*)(\s*\()?")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "atan2", "inf", "nan"}
# Aggregation operators may be followed by `by (...)` before their parenthesis.
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                 "quantile", "limitk", "limit_ratio"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords or labels."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges, subqueries, $__rate_interval
    text = _GROUPING.sub(r"\1", text)  # by (topic, partition) ...
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.groups()
        if call or name.lower() in _KEYWORDS | _AGGREGATIONS:
            continue
        names.add(name)
    return names


def alert_rules() -> list[dict]:
    rules = k8s_objects()["PrometheusRule"]["spec"]["groups"]
    return [rule for group in rules for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> Iterator[dict]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", []) if t.get("expr")]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends in a line continuation"
    return instructions


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def sink_names_in(text: str) -> set[str]:
    """SINK_* names in a text, leaving out prefix mentions such as `SINK_KAFKA_*` or `SINK_KAFKA_<NAME>`."""
    names = set()
    for match in re.finditer(r"\bSINK_[A-Z0-9_]*[A-Z0-9]\b", text):
        if text[match.end():match.end() + 2] in ("_*", "_<"):
            continue
        names.add(match.group())
    return names


def setting_problem(name: str) -> str | None:
    declared = declared_envs()
    if name in declared:
        return None
    if not name.startswith(KAFKA_PASSTHROUGH_PREFIX):
        close = difflib.get_close_matches(name, sorted(declared), n=1)
        return f"{name} is not a declared setting" + (f" (did you mean {close[0]}?)" if close else "")
    prop = name[len(KAFKA_PASSTHROUGH_PREFIX):].lower().replace("_", ".")
    if prop in RESERVED_KAFKA_PROPERTIES:
        return f"{name} would pass `{prop}`, which the service sets itself"
    if prop not in KNOWN_LIBRDKAFKA_PROPERTIES:
        return f"{name} would pass `{prop}` to librdkafka, which is not in KNOWN_LIBRDKAFKA_PROPERTIES"
    return None


def github_anchor(heading: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def configmap_data() -> dict[str, str]:
    return k8s_objects()["ConfigMap"]["data"]


def secret_data() -> dict[str, str]:
    return k8s_objects()["Secret"]["stringData"]


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with VAR unset."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


# --- YAML and JSON parse --------------------------------------------------------------------------

def test_deploy_has_the_expected_files():
    expected = {"deployment.yaml", "configmap.yaml", "secret.yaml", "service.yaml", "servicemonitor.yaml",
                "poddisruptionbudget.yaml", "prometheus-rules.yaml"}
    assert expected <= {p.name for p in K8S.glob("*.yaml")}
    assert COMPOSE.is_file() and DASHBOARD.is_file() and DEPLOY_README.is_file()


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path):
    docs = load_yaml_docs(path)
    assert docs, f"{path} holds no document"
    for doc in docs:
        assert isinstance(doc, dict)


def test_kubernetes_manifests_have_kind_version_and_name():
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_yaml_docs(path):
            assert doc.get("apiVersion") and doc.get("kind"), path
            if doc["kind"] != "Kustomization":
                assert doc["metadata"]["name"] == APP, path
                assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == APP, path


def test_kustomization_lists_every_manifest():
    listed = set(k8s_objects()["Kustomization"]["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_dashboard_is_valid_grafana_json():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41
    assert board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"namespace", "job", "topic"} <= set(variables), "one deployment at a time: namespace and job variables"
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard_panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


# --- metric names ---------------------------------------------------------------------------------

def test_promql_metric_name_extraction():
    expr = ('histogram_quantile(0.99, sum by (le, target) (rate(a_bucket{x="y", topic=~"$topic"}[$__rate_interval])))'
            ' > 1e3 and on (topic) b or absent(up{job="j"}) unless bool time() - c offset 5m')
    assert promql_metric_names(expr) == {"a_bucket", "b", "up", "c"}


def test_known_sample_names_cover_types():
    names = known_sample_names()
    assert {"sink_records_read_total", "sink_upload_duration_seconds_bucket", "sink_upload_duration_seconds_sum",
            "sink_upload_duration_seconds_count", "sink_consumer_lag_records"} <= names
    assert "sink_records_read" not in names


def test_alert_rules_use_only_existing_metrics():
    exprs = [rule["expr"] for rule in alert_rules()]
    used = set().union(*(promql_metric_names(e) for e in exprs))
    unknown = used - known_sample_names() - EXTERNAL_METRICS
    assert not unknown, f"alert rules use metrics the service does not expose: {sorted(unknown)}"
    mentioned = set().union(*(re.findall(r"\bsink_\w+", e) for e in exprs))
    assert mentioned <= known_sample_names()


def test_dashboard_uses_only_existing_metrics():
    exprs = dashboard_exprs()
    used = set().union(*(promql_metric_names(e) for e in exprs))
    unknown = used - known_sample_names() - EXTERNAL_METRICS
    assert not unknown, f"dashboard uses metrics the service does not expose: {sorted(unknown)}"
    for variable in dashboard()["templating"]["list"]:
        for metric in re.findall(r"label_values\(\s*([\w:]+)\s*,", json.dumps(variable.get("query", ""))):
            assert metric in known_sample_names(), variable["name"]


def test_dashboard_covers_the_service_metrics():
    used = set().union(*(promql_metric_names(e) for e in dashboard_exprs()))
    wanted = {
        "sink_records_read_total", "sink_records_written_total", "sink_records_uploaded_total",
        "sink_uploaded_bytes_total", "sink_upload_duration_seconds_bucket", "sink_upload_retries_total",
        "sink_upload_failures_total", "sink_bad_records_total", "sink_consumer_lag_records",
        "sink_pending_records", "sink_oldest_pending_record_age_seconds", "sink_microbatch_duration_seconds_bucket",
        "sink_last_commit_timestamp_seconds",
    }
    assert wanted <= used, f"no panel for {sorted(wanted - used)}"
    for expr in dashboard_exprs():
        if "histogram_quantile" in expr:
            assert "_bucket" in expr and re.search(r"by \([^)]*\ble\b", expr), expr


# --- alerts ---------------------------------------------------------------------------------------

def test_required_alerts_exist_with_annotations_and_runbooks():
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert set(rules) >= REQUIRED_ALERTS
    headings = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", DEPLOY_README.read_text(), re.M)}
    assert "runbook" in headings
    for name, rule in rules.items():
        annotations = rule["annotations"]
        assert annotations.get("summary") and annotations.get("description"), name
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        anchor = annotations["runbook_url"].rpartition("#")[2]
        assert anchor.startswith("runbook"), name
        assert anchor in headings, f"{name}: no heading for #{anchor} in deploy/README.md"


def test_alert_expressions_say_what_the_brief_asks():
    rules = {rule["alert"]: " ".join(rule["expr"].split()) for rule in alert_rules()}
    assert "deriv(sink_consumer_lag_records[15m]) > 0" in rules["SinkConsumerLagGrowing"]
    assert "increase(sink_upload_failures_total[10m])" in rules["SinkUploadsFailing"]
    # Until a partition's first commit, its assignment time stands in for the last commit.
    assert ("max_over_time(sink_last_commit_timestamp_seconds[1h]) or "
            "min_over_time(sink_partition_assigned_timestamp_seconds[1h])") in rules["SinkNoCommit"]
    assert ") > 600 ) and on (namespace, job, topic, partition)" in rules["SinkNoCommit"]
    assert "max_over_time(sink_consumer_lag_records[5m])) > 0" in rules["SinkNoCommit"]
    assert 'increase(sink_bad_records_total{reason!="tombstone"}[10m])' in rules["SinkBadRecords"]
    assert "sink_ready" in rules["SinkNotReady"] and "kube_pod_status_ready" in rules["SinkNotReady"]
    assert "up{job=\"kafka-parquet-sink\"} == 0" in rules["SinkDown"]


# --- settings -------------------------------------------------------------------------------------

def test_setting_names_check_itself():
    assert setting_problem("SINK_TOPICS") is None
    assert setting_problem("SINK_KAFKA_SASL_MECHANISM") is None
    assert "SINK_TOPICS" in setting_problem("SINK_TOPIC")
    assert setting_problem("SINK_KAFKA_GROUP_ID")
    assert setting_problem("SINK_KAFKA_SASL_MECHANSIM")
    assert sink_names_in("`SINK_KAFKA_*` and SINK_KAFKA_<NAME>, SINK_HTTP_PORT=0") == {"SINK_HTTP_PORT"}


def test_every_sink_setting_in_deploy_and_dockerfile_is_declared():
    files = [DOCKERFILE, *sorted(p for p in DEPLOY.rglob("*") if p.is_file())]
    problems = []
    for path in files:
        for name in sorted(sink_names_in(path.read_text())):
            problem = setting_problem(name)
            if problem:
                problems.append(f"{path.relative_to(ROOT)}: {problem}")
    assert not problems, "\n".join(problems)


def test_configmap_and_secret_together_are_a_valid_configuration():
    data, secret = configmap_data(), secret_data()
    assert all(isinstance(v, str) for v in data.values()), "ConfigMap values must be strings (quote numbers)"
    assert all(isinstance(v, str) for v in secret.values())
    assert not set(data) & set(secret), "a setting is in both the ConfigMap and the Secret"
    secret_envs = {f.metadata["env"] for f in declared_fields() if f.metadata["secret"]}
    assert not set(data) & secret_envs, "secret settings belong in secret.yaml"
    assert {"SINK_EMS_AUTHORIZATION", "SINK_KAFKA_SASL_PASSWORD"} <= set(secret)
    for value in secret.values():
        assert "REPLACE-ME" in value, "secret.yaml holds placeholders only"
    try:
        load_config({**data, **secret})
    except ConfigError as exc:
        pytest.fail(f"ConfigMap + Secret do not load: {exc}")


def test_compose_service_environment_is_a_valid_configuration():
    services = compose()["services"]
    env = {k: interpolate(str(v)) for k, v in services["sink"]["environment"].items()}
    try:
        config = load_config(env)
    except ConfigError as exc:
        pytest.fail(f"docker-compose sink environment does not load: {exc}")
    assert config.ems_authorization == interpolate(services["local-ems"]["environment"]["LOCAL_EMS_AUTHORIZATION"])


# --- Kubernetes objects fit together --------------------------------------------------------------

def pod_spec() -> dict:
    return k8s_objects()["Deployment"]["spec"]["template"]["spec"]


def container() -> dict:
    (only,) = pod_spec()["containers"]
    return only


def test_replicas_roll_one_at_a_time_without_surge():
    spec = k8s_objects()["Deployment"]["spec"]
    assert spec["replicas"] >= 1
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    text = (K8S / "deployment.yaml").read_text()
    assert "consumer group" in text and "static group member" in text, "deployment.yaml explains replicas"


def test_grace_period_exceeds_shutdown_timeout():
    shutdown_s = int(configmap_data()["SINK_SHUTDOWN_TIMEOUT_MS"]) / 1000
    assert pod_spec()["terminationGracePeriodSeconds"] > shutdown_s


def test_probes_point_at_health_endpoints_on_the_http_port():
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http-metrics": int(configmap_data()["SINK_HTTP_PORT"])}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in ports or c[probe]["httpGet"]["port"] in ports.values()


def test_pod_runs_non_root_with_read_only_root_and_writable_scratch():
    spec, c = pod_spec(), container()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == dockerfile_uid()
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    scratch = configmap_data()["SINK_SCRATCH_DIR"]
    assert any(scratch == path or scratch.startswith(path.rstrip("/") + "/") for path in mounts), scratch


def test_deployment_states_the_driver_heap_the_code_sets():
    from sink_service.startup.spark_session import DRIVER_HEAP

    heap_mib = int(DRIVER_HEAP.removesuffix("m"))
    text = (K8S / "deployment.yaml").read_text()
    stated = {int(n) for n in re.findall(r"capped at (\d+) MiB", text)}
    assert stated == {heap_mib}, f"deployment.yaml states heap {stated}, the code caps it at {heap_mib} MiB"
    assert not re.search(r"\b1 GiB heap", text)


def test_resources_fit_a_local_two_core_driver():
    resources = container()["resources"]
    assert configmap_data()["SINK_SPARK_MASTER"] == "local[2]"
    assert float(resources["requests"]["cpu"]) >= 2
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_env_comes_from_the_configmap_and_secret():
    refs = container()["envFrom"]
    assert {"configMapRef": {"name": APP}} in refs and {"secretRef": {"name": APP}} in refs


def test_service_monitor_and_pdb_select_the_pod():
    labels = k8s_objects()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = k8s_objects()["Service"]["spec"]
    assert service["selector"].items() <= labels.items()
    (port,) = service["ports"]
    assert port["name"] == "http-metrics" and port["port"] == 8080 and port["targetPort"] == "http-metrics"
    monitor = k8s_objects()["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= k8s_objects()["Service"]["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http-metrics" and endpoint["path"] == "/metrics"
    pdb = k8s_objects()["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb.get("maxUnavailable") == 1 or pdb.get("minAvailable") == 0
    # Not ready during an endpoint outage must not block node drains.
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert "outage" in (K8S / "poddisruptionbudget.yaml").read_text(), "the PDB's comment says why"
    assert k8s_objects()["PrometheusRule"]["apiVersion"] == "monitoring.coreos.com/v1"


# --- docker-compose -------------------------------------------------------------------------------

def test_compose_runs_kafka_endpoint_and_service():
    services = compose()["services"]
    assert services["kafka"]["image"] == "apache/kafka:3.8.0"
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    ems, sink = services["local-ems"], services["sink"]
    assert ems["entrypoint"] == ["python", "-m", "local_ems"]
    assert ems["image"] == sink["image"] and ems["build"] == sink["build"]
    assert ems["build"]["context"] == ".." and (COMPOSE.parent / ems["build"]["context"] / "Dockerfile").is_file()
    assert "--authorization" not in ems["command"], "the key comes from LOCAL_EMS_AUTHORIZATION"
    # Plain http is allowed only to loopback: the service shares the endpoint's network namespace.
    assert sink["network_mode"] == "service:local-ems"
    assert interpolate(sink["environment"]["SINK_EMS_ENDPOINT"]).startswith("http://127.0.0.1:18080/")
    grace_s = int(sink["stop_grace_period"].removesuffix("s"))
    assert grace_s > int(sink["environment"]["SINK_SHUTDOWN_TIMEOUT_MS"]) / 1000
    for service in services.values():
        image = service.get("image", "")
        assert image and not image.endswith(":latest") and ":" in image, image
    assert "Docker engine" in COMPOSE.read_text()


# --- Dockerfile -----------------------------------------------------------------------------------

def dockerfile_uid() -> int:
    users = [args for keyword, args in final_stage(dockerfile_instructions()) if keyword == "USER"]
    assert users, "the runtime stage has no USER"
    return int(users[-1].split(":")[0])


def test_dockerfile_base_images_are_pinned():
    instructions = dockerfile_instructions()
    stages: set[str] = set()
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert len(froms) >= 2, "multi-stage build expected"
    for args in froms:
        parts = [p for p in args.split() if not p.startswith("--")]
        image = parts[0]
        if len(parts) >= 3 and parts[1].upper() == "AS":
            stages.add(parts[2].lower())
        if image.lower() in stages:
            continue
        name, _, digest = image.partition("@")
        _, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
        assert tag, f"{image}: no tag"
        assert tag != "latest", f"{image}: latest is not a version"
        assert re.match(r"\d+\.\d+\.\d+", tag), f"{image}: not an exact version tag"
        assert not digest or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), image
    assert "digest" in DOCKERFILE.read_text().lower(), "explain how to pin the digest"


def test_dockerfile_runtime_stage():
    instructions = dockerfile_instructions()
    final = final_stage(instructions)
    keywords = [k for k, _ in final]
    entrypoints = [args for k, args in final if k == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == [ENTRYPOINT_IN_IMAGE, "python", "-m", "sink_service"]
    assert "USER" in keywords and keywords.index("USER") < keywords.index("ENTRYPOINT")
    assert dockerfile_uid() == 10001
    healthchecks = [args for k, args in final if k == "HEALTHCHECK"]
    assert healthchecks and "/healthz" in healthchecks[-1] and "SINK_HTTP_PORT" in healthchecks[-1]
    assert "curl" not in healthchecks[-1] and "python" in healthchecks[-1]
    assert any(k == "EXPOSE" and "8080" in args.split() for k, args in final)
    env = " ".join(args for k, args in final if k == "ENV")
    for name in ("PYSPARK_PYTHON=/opt/venv/bin/python", "JAVA_HOME=", "SINK_SCRATCH_DIR=/tmp/sink"):
        assert name in env
    runs = " ".join(args for k, args in final if k == "RUN")
    assert "openjdk-17-jre-headless" in runs and "--no-install-recommends" in runs
    assert "rm -rf /var/lib/apt/lists" in runs
    for tool in ("build-essential", "gcc", "g++", "git ", "curl"):
        assert tool not in runs, f"{tool} in the runtime stage"
    # Spark's start-up is prepared against the runtime JVM, as root, before the user switch.
    prepare = [i for i, (k, args) in enumerate(final) if k == "RUN" and "python -m sink_service.spark_home" in args]
    assert prepare and prepare[0] < keywords.index("USER")
    assert prepare[0] > max(i for i, (k, args) in enumerate(final) if k == "ENV" and "JAVA_HOME=" in args)
    copies = [args for k, args in final if k == "COPY"]
    entrypoint_copy = f"--chmod=0755 {ENTRYPOINT.relative_to(ROOT)} {ENTRYPOINT_IN_IMAGE}"
    assert entrypoint_copy in copies, "the entrypoint script, executable"
    assert all("--from=" in args for args in copies if args != entrypoint_copy), \
        "the runtime stage copies only from the builder (and the entrypoint)"


def test_dockerfile_installs_from_the_lock_file_and_copies_no_tests():
    instructions = dockerfile_instructions()
    runs = [args for k, args in instructions if k == "RUN"]
    assert any("pip install" in r and "--require-hashes" in r and "-r requirements/runtime.txt" in r
               and "--no-cache-dir" in r for r in runs)
    assert not any("requirements.lock" in r or "requirements/test.txt" in r for r in runs)
    project = [r for r in runs if "pip install" in r and "/wheels/" in r]
    assert project and all("--no-deps" in r for r in project), "the project's wheel installs nothing unlocked"
    assert any("pip wheel" in r and "--no-deps" in r for r in runs)
    for keyword, args in instructions:
        if keyword in ("COPY", "ADD") and "--from=" not in args:
            sources = args.split()[:-1]
            assert not {"tests", "devkit", ".", "./", "bench"} & {s.rstrip("/") for s in sources}, args


def test_dockerignore_keeps_the_context_small():
    patterns = {line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip()[:1] not in ("", "#")}
    assert {".venv", ".git", "tests", "bench", ".scratch"} <= patterns


def test_image_runs_on_any_uid():
    """OpenShift's arbitrary uid (group 0) must find everything it writes writable and a passwd entry.

    The image used to create /tmp/sink owned by 10001, which the service refuses for any other uid."""
    final = final_stage(dockerfile_instructions())
    runs = " ".join(args for k, args in final if k == "RUN")
    assert "/tmp/sink" not in runs, "the service creates its scratch directory itself, owned by its own uid"
    assert "libnss-wrapper" in runs, "the entrypoint's passwd entry for a uid the image does not know"
    assert "chmod" not in runs or "/etc/passwd" not in runs, "/etc/passwd stays read-only"
    env = " ".join(args for k, args in final if k == "ENV")
    scratch = re.search(r"SINK_SCRATCH_DIR=(\S+)", env).group(1)
    assert [args for k, args in final if k == "WORKDIR"][-1] == "/tmp" and scratch.startswith("/tmp/")


def test_dockerignore_lets_only_the_entrypoint_out_of_deploy():
    from devkit.image_dockerfile import DockerIgnore

    ignore = DockerIgnore(ROOT)
    assert not ignore.excluded(str(ENTRYPOINT.relative_to(ROOT)))
    assert ignore.excluded("deploy/kubernetes/deployment.yaml") and ignore.excluded("deploy/README.md")


# The entrypoint, run on this host: nss_wrapper from Debian's libnss-wrapper (scripts/bootstrap.sh puts its
# library in .venv wherever apt-get is); a uid without a passwd entry is made with a user namespace.
NSS_WRAPPER = next(iter([*sorted(Path("/usr/lib").glob("*/libnss_wrapper.so")),
                         *(ROOT / ".venv" / "lib" / "nss_wrapper").glob("libnss_wrapper.so")]), None)
needs_nss_wrapper = pytest.mark.skipif(
    NSS_WRAPPER is None and os.environ.get("CI") != "true",
    reason="libnss_wrapper.so not installed (Debian: apt-get install libnss-wrapper)")
WHO = ("import os, pwd; e = pwd.getpwuid(os.getuid()); "
       "print(e.pw_name, e.pw_uid, e.pw_gid, e.pw_dir, os.environ.get('LD_PRELOAD', '-'))")


def unshare_as(uid: int, gid: int) -> list[str]:
    return ["unshare", "--user", f"--map-user={uid}", f"--map-group={gid}", "--"]


@needs_nss_wrapper
def test_entrypoint_gives_an_unknown_uid_a_passwd_entry(tmp_path):
    """Without an entry the JVM's login fails ("Invalid UID"); the entrypoint adds one, /etc/passwd untouched."""
    unknown_uid, who = unshare_as(1000680000, 0), [sys.executable, "-c", WHO]
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path), "NSS_WRAPPER_LIB": str(NSS_WRAPPER)}
    without = subprocess.run([*unknown_uid, *who], capture_output=True, text=True, env=env, timeout=30)
    assert without.returncode != 0 and "uid not found: 1000680000" in without.stderr, "the uid must be unknown"
    done = subprocess.run([*unknown_uid, str(ENTRYPOINT), *who], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    name, uid, gid, home, preload = done.stdout.split()
    assert (name, uid, gid, home) == ("sink-1000680000", "1000680000", "0", "/tmp")
    assert preload.endswith("libnss_wrapper.so")
    [written] = tmp_path.glob("passwd.*/passwd")
    assert written.read_text().startswith(Path("/etc/passwd").read_text())


def test_entrypoint_leaves_a_known_uid_alone():
    done = subprocess.run([str(ENTRYPOINT), sys.executable, "-c", WHO], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1:3] == [str(os.getuid()), str(os.getgid())]
    assert done.stdout.split()[-1] == "-", "no nss_wrapper for a uid with an entry"


def test_hadolint_is_installed_and_passes():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(ROOT / ".venv" / "bin"))
    if not hadolint:  # scripts/bootstrap.sh installs it from requirements/lint.txt where a wheel exists
        pytest.skip("hadolint not installed (scripts/bootstrap.sh installs it on Linux x86-64 and arm64)")
    # DL3008: apt packages come from the pinned Debian release; pinning exact Debian versions breaks
    # builds whenever the archive moves on.
    result = subprocess.run([hadolint, "--ignore", "DL3008", str(DOCKERFILE)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
