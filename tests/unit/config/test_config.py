"""Configuration declared as data: validation, masking, pass-through and generated docs."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sink_service.config import (
    MASK,
    NON_SETTING_NAMES,
    ConfigError,
    SinkConfig,
    declared_fields,
    load_config,
    reference_markdown,
)

AUTH = "AppKey very-secret-app-key-0123456789"
MINIMAL = {
    "SINK_KAFKA_BOOTSTRAP_SERVERS": "broker-1:9092,broker-2:9092",
    "SINK_TOPICS": "orders",
    "SINK_EMS_ENDPOINT": "https://team.realm.celonis.cloud/continuous-batch-processing/api/v1/pool/items",
    "SINK_EMS_AUTHORIZATION": AUTH,
    "SINK_EMS_TARGET_TABLE": "{topic}_table",
}


def env(**overrides: str | None) -> dict[str, str]:
    merged = {**MINIMAL, **overrides}
    return {k: v for k, v in merged.items() if v is not None}


def problems_of(environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(environ)
    return info.value.problems


def test_minimal_environment_loads_with_defaults():
    config = load_config(MINIMAL)
    assert config.kafka_bootstrap_servers == "broker-1:9092,broker-2:9092"
    assert config.topics == ("orders",)
    assert config.topic_pattern is None
    assert config.ems_authorization == AUTH
    assert config.flush_records == 100_000
    assert config.starting_offsets == "earliest"
    assert config.order_field == "_offset"
    assert config.kafka_options == {}


def test_values_are_parsed_by_declared_type():
    config = load_config(env(
        SINK_TOPICS=" orders , tickets ,, ",
        SINK_FLUSH_RECORDS=" 500 ",
        SINK_PRIMARY_KEYS="id, region",
        SINK_STARTING_OFFSETS="latest",
        SINK_EMS_FALLBACK_VARCHAR_LENGTH="80",
    ))
    assert config.topics == ("orders", "tickets")
    assert config.flush_records == 500
    assert config.primary_keys == ("id", "region")
    assert config.starting_offsets == "latest"
    assert config.ems_fallback_varchar_length == 80


def test_blank_values_mean_default():
    config = load_config(env(SINK_FLUSH_RECORDS="  ", SINK_GROUP_ID=""))
    assert config.flush_records == 100_000
    assert config.group_id == "kafka-parquet-sink"


def test_topic_pattern_instead_of_topics():
    config = load_config(env(SINK_TOPICS=None, SINK_TOPIC_PATTERN=r"orders\..*"))
    assert config.topics == ()
    assert config.topic_pattern == r"orders\..*"


def test_every_problem_is_reported_at_once():
    problems = problems_of({
        "SINK_TOPICS": "orders",
        "SINK_TOPIC_PATTERN": "orders.*",
        "SINK_FLUSH_RECORDS": "lots",
        "SINK_STARTING_OFFSETS": "middle",
        "SINK_EMS_ENDPOINT": "http://example.com/items",
        "SINK_EMS_TARGET_TABLE": "t",
    })
    text = "\n".join(problems)
    expected = [
        "SINK_KAFKA_BOOTSTRAP_SERVERS",  # missing
        "SINK_TOPIC_PATTERN",  # both topics and pattern
        "SINK_FLUSH_RECORDS",  # bad int
        "SINK_STARTING_OFFSETS",  # bad choice
        "SINK_EMS_ENDPOINT",  # http to a non-loopback host
        "SINK_EMS_AUTHORIZATION",  # missing
    ]
    for name in expected:
        assert name in text, f"{name} not reported in:\n{text}"
    assert len(problems) == len(expected)
    # Each problem names the SINK_ variable it is about.
    assert all("SINK_" in p for p in problems)
    assert any("'lots'" in p and "whole number" in p for p in problems)
    assert any("middle" in p and "earliest" in p and "latest" in p for p in problems)


def test_config_error_message_lists_every_problem():
    with pytest.raises(ConfigError) as info:
        load_config({})
    message = str(info.value)
    assert f"{len(info.value.problems)} configuration problem(s)" in message
    for problem in info.value.problems:
        assert problem in message


def test_minimum_is_enforced():
    problems = problems_of(env(SINK_FLUSH_BYTES="10", SINK_MAX_FILES_PER_BATCH="0"))
    assert any(p.startswith("SINK_FLUSH_BYTES=10") and "at least 1024" in p for p in problems)
    assert any(p.startswith("SINK_MAX_FILES_PER_BATCH=0") and "at least 1" in p for p in problems)


def test_neither_topics_nor_pattern_is_a_problem():
    problems = problems_of(env(SINK_TOPICS=None))
    assert any("SINK_TOPICS" in p and "SINK_TOPIC_PATTERN" in p for p in problems)


def test_invalid_topic_pattern_is_reported():
    problems = problems_of(env(SINK_TOPICS=None, SINK_TOPIC_PATTERN="orders(["))
    assert any("SINK_TOPIC_PATTERN" in p and "regular expression" in p for p in problems)


@pytest.mark.parametrize("endpoint", [
    "http://127.0.0.1:8080/items",
    "http://localhost:8080/items",
    "http://[::1]:8080/items",
    "https://example.com/items",
])
def test_accepted_endpoints(endpoint):
    assert load_config(env(SINK_EMS_ENDPOINT=endpoint)).ems_endpoint == endpoint


@pytest.mark.parametrize("endpoint", [
    "http://example.com/items",
    "http://10.0.0.1/items",
    "ftp://example.com/items",
    "example.com/items",
])
def test_rejected_endpoints(endpoint):
    problems = problems_of(env(SINK_EMS_ENDPOINT=endpoint))
    assert len(problems) == 1
    assert "SINK_EMS_ENDPOINT" in problems[0]


def test_authorization_must_name_its_scheme_without_showing_the_value():
    secret = "just-a-raw-key-without-scheme"
    problems = problems_of(env(SINK_EMS_AUTHORIZATION=secret))
    assert len(problems) == 1
    assert "SINK_EMS_AUTHORIZATION" in problems[0]
    assert secret not in problems[0]


def test_bearer_authorization_is_accepted():
    config = load_config(env(SINK_EMS_AUTHORIZATION="Bearer tok-123456"))
    assert config.ems_authorization == "Bearer tok-123456"


def test_secrets_never_appear_in_config_error():
    kafka_password = "kafka-pass-word-987654"
    with pytest.raises(ConfigError) as info:
        load_config(env(
            SINK_EMS_AUTHORIZATION="NotAScheme " + "topsecret-value-1",
            SINK_KAFKA_SASL_PASSWORD=kafka_password,
            SINK_KAFKA_GROUP_ID="not-allowed",
            SINK_FLUSH_RECORDS="x",
        ))
    text = str(info.value) + repr(info.value) + "\n".join(info.value.problems)
    assert "topsecret-value-1" not in text
    assert kafka_password not in text


def test_masked_dump_hides_secrets_and_shows_the_rest():
    kafka_password = "kafka-pass-word-987654"
    config = load_config(env(
        SINK_KAFKA_SASL_PASSWORD=kafka_password,
        SINK_KAFKA_SASL_USERNAME="svc-user",
        SINK_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
    ))
    dump = config.masked()
    assert dump["SINK_EMS_AUTHORIZATION"] == MASK
    assert dump["SINK_KAFKA_SASL_PASSWORD"] == MASK
    assert dump["SINK_KAFKA_SASL_USERNAME"] == "svc-user"
    assert dump["SINK_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert dump["SINK_KAFKA_BOOTSTRAP_SERVERS"] == "broker-1:9092,broker-2:9092"
    assert dump["SINK_TOPICS"] == ("orders",)
    text = repr(dump)
    assert AUTH not in text
    assert AUTH.split(" ", 1)[1] not in text
    assert kafka_password not in text
    # Every declared setting is in the dump.
    assert {f.metadata["env"] for f in declared_fields()} <= set(dump)


def test_masked_dump_does_not_mask_an_unset_secret():
    config = dataclasses.replace(load_config(MINIMAL), ems_authorization=None)
    assert config.masked()["SINK_EMS_AUTHORIZATION"] is None


def test_kafka_pass_through_options():
    config = load_config(env(
        SINK_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        SINK_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
        SINK_KAFKA_SASL_PASSWORD="pw-123456",
    ))
    assert config.kafka_options == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.password": "pw-123456",
    }
    # The declared SINK_KAFKA_BOOTSTRAP_SERVERS is not passed through a second time.
    assert "bootstrap.servers" not in config.kafka_options


@pytest.mark.parametrize("name, option", [
    ("SINK_KAFKA_GROUP_ID", "group.id"),
    ("SINK_KAFKA_ENABLE_AUTO_COMMIT", "enable.auto.commit"),
])
def test_reserved_pass_through_names_are_rejected(name, option):
    problems = problems_of(env(**{name: "x"}))
    assert len(problems) == 1
    assert name in problems[0]
    assert option in problems[0]


@pytest.mark.parametrize("name, value, why", [
    # With cooperative-sticky the member's eager assign raises on its thread: every commit then timed out.
    ("SINK_KAFKA_PARTITION_ASSIGNMENT_STRATEGY", "cooperative-sticky", "revokes everything"),
    ("SINK_KAFKA_GROUP_PROTOCOL", "consumer", "classic"),
    ("SINK_KAFKA_GROUP_INSTANCE_ID", "shared-id", "fence"),
    ("SINK_KAFKA_ENABLE_AUTO_OFFSET_STORE", "true", "uploaded"),
    ("SINK_KAFKA_ISOLATION_LEVEL", "read_uncommitted", "read_committed"),
])
def test_pass_through_names_that_group_membership_depends_on_are_rejected_with_the_reason(name, value, why):
    problems = problems_of(env(**{name: value}))
    assert len(problems) == 1, problems
    assert name in problems[0] and why in problems[0], problems[0]
    assert value not in problems[0]  # values of pass-through options are never shown: they may be secret


def test_every_membership_setting_passed_through_is_reported_at_once():
    problems = problems_of(env(SINK_KAFKA_PARTITION_ASSIGNMENT_STRATEGY="range", SINK_KAFKA_GROUP_PROTOCOL="consumer",
                               SINK_KAFKA_GROUP_INSTANCE_ID="x", SINK_FLUSH_RECORDS="many"))
    assert len(problems) == 4, problems
    assert {"SINK_KAFKA_PARTITION_ASSIGNMENT_STRATEGY", "SINK_KAFKA_GROUP_PROTOCOL", "SINK_KAFKA_GROUP_INSTANCE_ID",
            "SINK_FLUSH_RECORDS"} == {p.split(" ", 1)[0].split("=", 1)[0] for p in problems}


def test_membership_settings_that_stay_tunable_pass_through():
    config = load_config(env(SINK_KAFKA_SESSION_TIMEOUT_MS="30000", SINK_KAFKA_HEARTBEAT_INTERVAL_MS="3000"))
    assert config.kafka_options == {"session.timeout.ms": "30000", "heartbeat.interval.ms": "3000"}


def test_value_schema_errors_are_reported_as_config_problems():
    problems = problems_of(env(SINK_VALUE_SCHEMA="id STRING, amount MONEY"))
    assert len(problems) == 1
    assert "SINK_VALUE_SCHEMA" in problems[0]
    assert "money" in problems[0].lower()


def test_value_schema_out_of_range_decimal_is_a_config_problem():
    # Spark allows DECIMAL precision up to 38; a bigger one must be reported like any other mistake,
    # together with the other problems, not crash load_config with a bare ValueError.
    problems = problems_of(env(SINK_VALUE_SCHEMA="id STRING, amount DECIMAL(40,2)", SINK_FLUSH_RECORDS="x"))
    assert any("SINK_VALUE_SCHEMA" in p for p in problems)
    assert any("SINK_FLUSH_RECORDS" in p for p in problems)


def test_primary_keys_and_order_field_must_be_declared_in_the_value_schema():
    problems = problems_of(env(
        SINK_VALUE_SCHEMA="id STRING, amount DOUBLE",
        SINK_PRIMARY_KEYS="id,region",
        SINK_ORDER_FIELD="updated_at",
    ))
    assert len(problems) == 2
    assert any("SINK_PRIMARY_KEYS" in p and "`region`" in p for p in problems)
    assert any("SINK_ORDER_FIELD" in p and "`updated_at`" in p for p in problems)


def test_metadata_columns_may_be_primary_keys_with_a_declared_schema():
    config = load_config(env(SINK_VALUE_SCHEMA="amount DOUBLE", SINK_PRIMARY_KEYS="_key"))
    assert config.primary_keys == ("_key",)


def test_duplicate_primary_key_is_reported():
    problems = problems_of(env(SINK_PRIMARY_KEYS="id,id"))
    assert problems == ["SINK_PRIMARY_KEYS lists a field twice."]


def test_table_for_topic_template():
    config = load_config(env(SINK_EMS_TARGET_TABLE="raw_{topic}"))
    assert config.table_for("orders") == "raw_orders"
    fixed = load_config(env(SINK_EMS_TARGET_TABLE="all_events"))
    assert fixed.table_for("orders") == "all_events"


def test_reference_markdown_mentions_every_declared_setting():
    text = reference_markdown()
    for f in declared_fields():
        assert f"`{f.metadata['env']}`" in text
    assert "SINK_KAFKA_<NAME>" in text
    assert "**Secret**" in text
    # Defaults and choices come from the declarations too.
    assert "`100000`" in text
    assert "`earliest`, `latest`" in text


def test_every_field_except_internal_ones_is_declared_with_a_sink_env_name():
    for f in dataclasses.fields(SinkConfig):
        if f.metadata.get("internal"):
            continue
        assert f.metadata["env"].startswith("SINK_"), f.name
        assert f.metadata["doc"], f.name


@pytest.mark.parametrize("name", ["SINK_KAFKA_SSL_KEY_PEM", "SINK_KAFKA_SASL_OAUTHBEARER_CONFIG"])
def test_pass_through_options_librdkafka_marks_sensitive_are_masked(name):
    # librdkafka flags ssl.key.pem (a private key) and sasl.oauthbearer.config (may hold a client
    # secret) as sensitive; the startup dump must not print them.
    value = "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkqhkiG9w0BAQEFAASC-----END PRIVATE KEY-----"
    config = load_config(env(**{name: value}))
    dump = config.masked()
    assert dump[name] == MASK
    assert value not in repr(dump)


# --- credentials inside URL-valued settings -------------------------------------------------------

URL_CREDENTIAL = "url-pass-word-4711"


@pytest.mark.parametrize("name, url, shown", [
    ("SINK_EMS_PROXY_URL", f"http://proxy-user:{URL_CREDENTIAL}@proxy.corp:3128",
     f"http://{MASK}@proxy.corp:3128"),
    ("SINK_EMS_ENDPOINT", f"https://svc:{URL_CREDENTIAL}@team.realm.celonis.cloud/api/v1/p/items",
     f"https://{MASK}@team.realm.celonis.cloud/api/v1/p/items"),
    ("SINK_SPARK_MASTER", f"spark://admin:{URL_CREDENTIAL}@master:7077", f"spark://{MASK}@master:7077"),
    # Any pass-through value; (a name with TOKEN in it, like the real token endpoint URL, is masked whole).
    ("SINK_KAFKA_EXAMPLE_URL", f"https://client:{URL_CREDENTIAL}@idp.corp/x", f"https://{MASK}@idp.corp/x"),
])
def test_masked_dump_hides_credentials_written_into_urls(name, url, shown):
    dump = load_config(env(**{name: url, "SINK_SPARK_AUTH_SECRET": "cluster-secret"})).masked()
    assert dump[name] == shown  # scheme, host and port stay visible
    assert URL_CREDENTIAL not in repr(dump)


def test_masked_dump_hides_a_user_name_only_credential_in_the_s3_endpoint():
    # `https://<access key>@host` carries no password, but the user part is still a credential.
    config = load_config(env(SINK_TARGET="s3", SINK_S3_BUCKET="lake",
                             SINK_S3_ENDPOINT_URL=f"https://{URL_CREDENTIAL}@minio.internal:9000"))
    assert config.masked()["SINK_S3_ENDPOINT_URL"] == f"https://{MASK}@minio.internal:9000"


def test_every_text_setting_is_masked_when_it_holds_a_url_with_credentials():
    # Guards settings added later: any text value shaped like a URL with userinfo is masked.
    config = load_config(MINIMAL)
    url = f"https://someone:{URL_CREDENTIAL}@host.example:8443/x"
    text_fields = [f.name for f in declared_fields() if isinstance(getattr(config, f.name), str)]
    dump = dataclasses.replace(config, **dict.fromkeys(text_fields, url)).masked()
    assert URL_CREDENTIAL not in repr(dump) and "someone" not in repr(dump)


def test_config_error_does_not_show_credentials_of_a_bad_url():
    problems = problems_of(env(SINK_EMS_ENDPOINT=f"ftp://u:{URL_CREDENTIAL}@example.com/items"))
    assert any("SINK_EMS_ENDPOINT" in p for p in problems)
    assert URL_CREDENTIAL not in "\n".join(problems)


# --- plain-http S3 endpoints ----------------------------------------------------------------------

S3 = {"SINK_TARGET": "s3", "SINK_S3_BUCKET": "lake"}


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9000", "http://127.8.0.1:9000", "http://localhost:9000", "http://[::1]:9000",
    "https://minio.internal:9000",
])
def test_s3_endpoint_over_http_is_accepted_for_loopback(url):
    assert load_config(env(**S3, SINK_S3_ENDPOINT_URL=url)).s3_endpoint_url == url


@pytest.mark.parametrize("url", ["http://minio.internal:9000", "http://10.0.0.5:9000", "http://localhost.evil.com"])
def test_s3_endpoint_over_http_to_another_host_is_a_problem_naming_both_settings(url):
    problems = problems_of(env(**S3, SINK_S3_ENDPOINT_URL=url))
    assert len(problems) == 1
    assert "SINK_S3_ENDPOINT_URL" in problems[0] and "SINK_S3_ALLOW_HTTP" in problems[0]


def test_s3_allow_http_accepts_plain_http_to_any_host():
    config = load_config(env(**S3, SINK_S3_ENDPOINT_URL="http://minio.internal:9000", SINK_S3_ALLOW_HTTP="true"))
    assert config.s3_allow_http is True
    assert load_config(env(**S3)).s3_allow_http is False


def test_s3_allow_http_must_be_true_or_false():
    problems = problems_of(env(**S3, SINK_S3_ALLOW_HTTP="yes"))
    assert len(problems) == 1
    assert problems[0].startswith("SINK_S3_ALLOW_HTTP=yes") and "true" in problems[0]


# --- unknown SINK_* names -------------------------------------------------------------------------

def test_a_misspelt_setting_is_reported_with_the_closest_known_name():
    problems = problems_of(env(SINK_FLUSH_RECRODS="5"))
    assert len(problems) == 1
    assert "SINK_FLUSH_RECRODS" in problems[0] and "SINK_FLUSH_RECORDS" in problems[0]


def test_unknown_names_are_listed_with_all_other_problems():
    problems = problems_of(env(SINK_FLUSH_RECRODS="5", SINK_TOTALLY_NEW="x", SINK_FLUSH_BYTES="10"))
    assert len(problems) == 3
    assert any(p.startswith("SINK_FLUSH_BYTES=10") for p in problems)
    assert any("SINK_TOTALLY_NEW" in p for p in problems)


def test_the_value_of_an_unknown_name_is_never_shown():
    # A misspelt secret setting still holds the secret.
    problems = problems_of(env(SINK_EMS_AUTHORISATION="AppKey misspelt-but-secret-42"))
    assert "SINK_EMS_AUTHORIZATION" in problems[0]
    assert "misspelt-but-secret-42" not in "\n".join(problems)


def test_kafka_pass_through_names_are_not_checked_against_the_declarations():
    config = load_config(env(SINK_KAFKA_SASL_MECHANISMS="PLAIN"))
    assert config.kafka_options == {"sasl.mechanisms": "PLAIN"}


@pytest.mark.parametrize("scope", ["service", "target"])
def test_the_test_harness_names_are_not_settings_and_not_problems(scope):
    names = {"SINK_TEST_BROKER": "noida", "SINK_TEST_BOOTSTRAP": "127.0.0.1:9092", "SINK_TEST_WORKERS": "4"}
    load_config(env(**names), scope=scope)


def test_unknown_names_are_problems_in_the_uploader_scope_too():
    problems = problems_of_scope({"SINK_TARGET": "dir", "SINK_DIR_PATH": "/tmp/x", "SINK_DIR_PATHS": "/tmp/y"})
    assert problems == [problems[0]] and "SINK_DIR_PATH" in problems[0]


def problems_of_scope(environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(environ, scope="target")
    return info.value.problems


def test_every_sink_variable_the_project_reads_is_declared_or_a_known_non_setting():
    # The service and `python -m uploader` read os.environ whole; a SINK_ name the project itself
    # reads or sets (devkit, bench, scripts) must not turn into a startup error. Shell scripts read
    # them as $NAME or ${NAME...} (SINK_TEST_WORKERS of scripts/test.sh slipped past a Python-only scan).
    pattern = re.compile(r"""environ(?:\.get\(|\[|\.setdefault\()\s*["'](SINK_[A-Z0-9_]+)["']|\$\{?(SINK_[A-Z0-9_]+)""")
    root = Path(__file__).resolve().parents[3]
    sources = [p for p in root.rglob("*.py") if ".venv" not in p.parts] + sorted(root.glob("scripts/*"))
    read = {name for path in sources if path.is_file()
            for names in pattern.findall(path.read_text(errors="replace")) for name in names if name}
    assert {"SINK_TEST_BROKER", "SINK_TEST_BOOTSTRAP", "SINK_TEST_WORKERS"} <= read  # the scan finds what it looks for
    known = {f.metadata["env"] for f in declared_fields()} | NON_SETTING_NAMES
    assert {n for n in read if not n.startswith("SINK_KAFKA_")} <= known


def test_a_misspelt_setting_makes_the_service_exit_2():
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SINK_")}
    result = subprocess.run([sys.executable, "-m", "sink_service"], env={**environ, **env(SINK_FLUSH_RECRODS="5")},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "SINK_FLUSH_RECRODS" in result.stderr and "SINK_FLUSH_RECORDS" in result.stderr


def test_a_standalone_cluster_needs_the_spark_auth_secret():
    env = {"SINK_KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SINK_TOPICS": "t", "SINK_TARGET": "dir",
           "SINK_DIR_PATH": "/tmp/x", "SINK_SPARK_MASTER": "spark://10.0.0.5:7077"}
    with pytest.raises(ConfigError, match="SINK_SPARK_AUTH_SECRET is required"):
        load_config(env)
    config = load_config({**env, "SINK_SPARK_AUTH_SECRET": "s3cr3t-value"})
    assert config.masked()["SINK_SPARK_AUTH_SECRET"] != "s3cr3t-value"
    assert load_config({**env, "SINK_SPARK_MASTER": "local[2]"}).spark_auth_secret is None
