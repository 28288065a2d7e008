"""`sink-service check` without a network: the line format, secrets kept out, the probe names, and a
configuration error (exit 2, every problem, with --json too)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

from sink_service.check.kafka_probes import _first_sentence, _setting_in, refusal_fix
from sink_service.check.probe import FAIL, OK, SKIP, WARN, Probe
from sink_service.check.target_probes import PROBE_DIR, _reason, dir_probe, probe_key
from sink_service.cli import check
from sink_service.config import load_config
from uploader.directory import DirectorySettings
from uploader.errors import FatalUploadError


def test_each_status_has_its_line_shape():
    assert Probe(OK, "topic orders", "3 partition(s)").line() == "OK topic orders (3 partition(s))"
    assert Probe(OK, "configuration").line() == "OK configuration"
    assert Probe(FAIL, "topic x", "does not exist", "SINK_TOPICS").line() == \
        "FAIL topic x: does not exist — fix SINK_TOPICS"
    assert Probe(FAIL, "EMS endpoint", "HTTP 503: try again later").line() == \
        "FAIL EMS endpoint: HTTP 503: try again later"
    assert Probe(WARN, "a", "b", "c").line() == "WARN a: b — fix c"
    assert Probe(SKIP, "topics", "not probed").line() == "SKIP topics: not probed"
    assert [p.failed for p in (Probe(OK, "a"), Probe(FAIL, "a"), Probe(WARN, "a"), Probe(SKIP, "a"))] == \
        [False, True, False, False]


def test_a_kafka_refusal_becomes_its_reason_and_the_settings_to_fix():
    login = ("Kafka refused the login (SASL authentication error: Authentication failed): check "
             "SINK_KAFKA_SASL_USERNAME and SINK_KAFKA_SASL_PASSWORD (and SINK_KAFKA_SASL_MECHANISM)")
    assert _first_sentence(login) == "Kafka refused the login (SASL authentication error: Authentication failed)"
    assert refusal_fix(login).startswith("SINK_KAFKA_SASL_USERNAME/SINK_KAFKA_SASL_PASSWORD")
    ca = ("the broker's TLS certificate does not verify (ssl: certificate verify failed): set "
          "SINK_KAFKA_SSL_CA_LOCATION to the CA certificate that signed it")
    assert _first_sentence(ca) == "the broker's TLS certificate does not verify (ssl: certificate verify failed)"
    assert refusal_fix(ca) == "SINK_KAFKA_SSL_CA_LOCATION"


def test_a_client_setting_librdkafka_refuses_is_named_as_its_variable():
    options = {"ssl.ca.location": "/nope", "security.protocol": "SSL"}
    assert _setting_in('ssl.ca.location failed: No such file', options) == "SINK_KAFKA_SSL_CA_LOCATION"
    assert _setting_in("something else", options) == "the SINK_KAFKA_* settings"


def test_an_uploader_error_loses_its_own_advice_but_keeps_the_facts():
    error = FatalUploadError("S3 write of s3://b/k was rejected with NoSuchBucket (HTTP 404) and will not be "
                             "retried: the bucket does not exist. Check SINK_S3_BUCKET. Server said: nope",
                             setting="SINK_S3_BUCKET")
    assert _reason(error) == ("S3 write of s3://b/k was rejected with NoSuchBucket (HTTP 404): the bucket does not "
                              "exist. Server said: nope")


def test_the_probe_object_is_named_under_the_prefix():
    assert probe_key("sink/data/").startswith(f"sink/data/{PROBE_DIR}/")
    assert probe_key("").startswith(f"{PROBE_DIR}/") and len(probe_key("").split("/")[1]) == 32


def test_a_directory_not_there_yet_is_fine_when_its_parent_is_writable(tmp_path: Path):
    probe = dir_probe(DirectorySettings(path=str(tmp_path / "a" / "b")), "dir target", "SINK_DIR_PATH")
    assert probe.status == OK and f"the service creates it in {tmp_path}" in probe.reason
    assert not (tmp_path / "a").exists()  # the probe created nothing


def _run(environ: dict[str, str], *, as_json: bool = False, timeout: float = 10.0) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = check.run(argparse.Namespace(json=as_json, timeout=timeout), environ, out, err)
    return code, out.getvalue(), err.getvalue()


def test_a_configuration_error_lists_every_problem_with_exit_2():
    environ = {"SINK_TARGET": "dir", "SINK_FLUSH_RECORDS": "-5", "SINK_TOPICZ": "orders",
               "SINK_SCHEMA_REGISTRY_BASIC_AUTH": "user:hidden-password-1"}
    code, out, err = _run(environ)
    assert code == 2 and out == ""
    for problem in ("SINK_KAFKA_BOOTSTRAP_SERVERS is required", "SINK_DIR_PATH", "SINK_FLUSH_RECORDS=-5",
                    "SINK_TOPICZ is not a setting"):
        assert problem in err
    code, out, err = _run(environ, as_json=True)
    document = json.loads(out)
    assert code == 2 and document["exit_code"] == 2 and document["ok"] is False
    assert len(document["config_problems"]) >= 4
    assert "hidden-password-1" not in out + err


def test_a_timeout_must_be_positive():
    code, _, err = _run({}, timeout=0)
    assert code == 2 and "--timeout" in err


def test_every_configured_secret_is_kept_out_of_the_lines():
    config = load_config({
        "SINK_KAFKA_BOOTSTRAP_SERVERS": "b:9092", "SINK_TOPICS": "t",
        "SINK_EMS_ENDPOINT": "https://team.realm.celonis.cloud/continuous-batch-processing/api/v1/pool/items",
        "SINK_EMS_AUTHORIZATION": "AppKey ems-key-secret", "SINK_EMS_TARGET_TABLE": "{topic}",
        "SINK_KAFKA_SASL_PASSWORD": "kafka-password-secret", "SINK_KAFKA_SASL_USERNAME": "user",
        "SINK_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "SINK_KAFKA_SASL_MECHANISM": "PLAIN",
    })
    secrets = check.configured_secrets(config)
    text = check._safe("login kafka-password-secret with ems-key-secret (AppKey ems-key-secret)", secrets)
    assert "kafka-password-secret" not in text and "ems-key-secret" not in text
