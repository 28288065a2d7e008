"""`sink-service check` against real components: the session's broker, local_ems, moto's S3 server, a
directory, local_registry, and the SASL/TLS broker of devkit.secured_broker.

Each test asserts the probe lines an operator reads (the setting named), the exit code, that no
secret appears, and that the probe left nothing behind (no upload, no object, no file, no topic).
"""

from __future__ import annotations

import argparse
import io
import json
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from devkit.kafka_data import create_topics
from devkit.secured_broker import SecuredBroker, running_secured_broker
from local_ems.server import LocalEmsServer
from local_registry.server import LocalRegistry
from sink_service.cli import check

KEY = "AppKey check-key-1234567890"
PASSWORD_USER = "sink-check"


@pytest.fixture(scope="module")
def ems(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEmsServer]:
    server = LocalEmsServer(tmp_path_factory.mktemp("ems"), KEY, host="127.0.0.1", port=0).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def topic(bootstrap: str) -> str:
    name = f"check-orders-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: 2})
    return name


def ems_env(bootstrap: str, topic: str, ems: LocalEmsServer, **overrides: str) -> dict[str, str]:
    return {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic,
            "SINK_GROUP_ID": f"check-{uuid.uuid4().hex[:8]}", "SINK_EMS_ENDPOINT": ems.items_url(),
            "SINK_EMS_AUTHORIZATION": KEY, "SINK_EMS_TARGET_TABLE": "{topic}", **overrides}


def check_in_process(environ: dict[str, str], as_json: bool = False, timeout: float = 10.0) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = check.run(argparse.Namespace(json=as_json, timeout=timeout), environ, out, err)
    return code, out.getvalue(), err.getvalue()


def check_subprocess(environ: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sink_service", "check", *args], capture_output=True, text=True,
                          timeout=90, env={"PATH": "/usr/bin:/bin", **environ})


def line(output: str, start: str) -> str:
    found = [text for text in output.splitlines() if text.startswith(start)]
    assert found, f"no line starting {start!r} in:\n{output}"
    return found[0]


# --- Kafka and EMS ---------------------------------------------------------------------------------
def test_all_ok_on_the_broker_and_local_ems_as_a_subprocess(bootstrap: str, topic: str, ems: LocalEmsServer):
    before = ems.stats()
    started = time.monotonic()
    done = check_subprocess(ems_env(bootstrap, topic, ems))
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert line(done.stdout, "OK Kafka broker").startswith(f"OK Kafka broker {bootstrap} (plaintext)")
    assert f"OK topic {topic} (2 partition(s)" in done.stdout
    assert "OK consumer group check-" in done.stdout
    assert "nothing uploaded" in line(done.stdout, "OK EMS endpoint")
    assert "FAIL" not in done.stdout and KEY.split()[1] not in done.stdout + done.stderr
    assert ems.uploads() == [] and ems.stats()["uploads"] == before["uploads"]  # the probe stored nothing
    print(f"check, all OK, as a subprocess: {elapsed:.2f} s")


def test_a_wrong_ems_key_names_the_authorization_setting(bootstrap: str, topic: str, ems: LocalEmsServer):
    code, out, _ = check_in_process(ems_env(bootstrap, topic, ems, SINK_EMS_AUTHORIZATION="AppKey wrong-key-987654"))
    assert code == 3
    failed = line(out, "FAIL EMS endpoint")
    assert "HTTP 401" in failed and failed.endswith("— fix SINK_EMS_AUTHORIZATION")
    assert "wrong-key-987654" not in out
    assert line(out, "OK Kafka broker")


def test_a_wrong_ems_path_names_the_endpoint_setting(bootstrap: str, topic: str, ems: LocalEmsServer):
    code, out, _ = check_in_process(ems_env(bootstrap, topic, ems, SINK_EMS_ENDPOINT=ems.url + "/items"))
    assert code == 3
    assert line(out, "FAIL EMS endpoint").endswith("— fix SINK_EMS_ENDPOINT")


def test_an_ems_outage_fails_without_blaming_a_setting(bootstrap: str, topic: str, ems: LocalEmsServer):
    ems.inject_fault(503, count=1)
    try:
        code, out, _ = check_in_process(ems_env(bootstrap, topic, ems))
    finally:
        ems.clear_faults()
    assert code == 3
    failed = line(out, "FAIL EMS endpoint")
    assert "HTTP 503" in failed and "try again later" in failed and "— fix" not in failed


def test_an_endpoint_whose_answer_proves_nothing_is_said_plainly(bootstrap: str, topic: str):
    """Not a failure: an endpoint that takes an empty POST says nothing about the key, and the check
    uploads no data to find out."""
    import http.server
    import threading

    class Anything(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Anything)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/continuous-batch-processing/api/v1/p/items"
        environ = {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_EMS_ENDPOINT": url,
                   "SINK_EMS_AUTHORIZATION": KEY, "SINK_EMS_TARGET_TABLE": "{topic}"}
        code, out, _ = check_in_process(environ)
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, out
    assert "cannot probe the key without uploading" in line(out, "SKIP EMS endpoint")


def test_a_missing_topic_names_the_topics_setting(bootstrap: str, topic: str, ems: LocalEmsServer):
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    code, out, _ = check_in_process(ems_env(bootstrap, f"{topic},{missing}", ems))
    assert code == 3
    assert line(out, f"FAIL topic {missing}") == \
        f"FAIL topic {missing}: does not exist — fix SINK_TOPICS, or create the topic"
    assert line(out, f"OK topic {topic}")
    assert missing not in _topics(bootstrap)  # describing it did not create it


def test_a_pattern_without_a_match_is_a_warning_not_a_failure(bootstrap: str, topic: str, ems: LocalEmsServer):
    environ = ems_env(bootstrap, topic, ems, SINK_TOPICS="", SINK_TOPIC_PATTERN=f"nothing-{uuid.uuid4().hex}.*")
    code, out, _ = check_in_process(environ)
    assert code == 0, out
    assert "no topic matches yet" in line(out, "WARN topics matching SINK_TOPIC_PATTERN=nothing-")
    code, out, _ = check_in_process({**environ, "SINK_TOPIC_PATTERN": "check-orders-.*"})
    assert code == 0 and topic in line(out, "OK topics matching SINK_TOPIC_PATTERN=check-orders-.*")


def test_an_unreachable_broker_is_one_fast_failure(topic: str, ems: LocalEmsServer):
    from devkit.brokers import free_port

    started = time.monotonic()
    done = check_subprocess(ems_env(f"127.0.0.1:{free_port()}", topic, ems), "--json")
    elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    probes = {" ".join(p["what"].split(" ")[:2]): p for p in json.loads(done.stdout)["probes"]}
    broker = probes["Kafka broker"]
    assert broker["status"] == "FAIL" and broker["fix"] == "SINK_KAFKA_BOOTSTRAP_SERVERS"
    assert "Connection refused" in broker["reason"]
    assert (probes["topics"]["status"], probes["consumer group"]["status"]) == ("SKIP", "SKIP")
    assert probes["EMS endpoint"]["status"] == "OK"  # the target is probed all the same
    assert elapsed < 8, f"an unreachable broker took {elapsed:.1f} s"
    print(f"check, unreachable broker, as a subprocess: {elapsed:.2f} s")


def test_a_silent_broker_fails_within_the_timeout(topic: str, ems: LocalEmsServer):
    """A port that accepts connections and never answers: the probe's deadline, not librdkafka's 30 s+."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        started = time.monotonic()
        code, out, _ = check_in_process(ems_env(f"127.0.0.1:{silent.getsockname()[1]}", topic, ems), timeout=2)
        elapsed = time.monotonic() - started
    finally:
        silent.close()
    assert code == 3
    assert "no answer within 2 s" in line(out, "FAIL Kafka broker")
    assert elapsed < 6, elapsed


def test_the_dead_letter_topic_present_or_creatable(bootstrap: str, topic: str, ems: LocalEmsServer):
    dlq = f"check-dlq-{uuid.uuid4().hex[:8]}"
    environ = ems_env(bootstrap, topic, ems, SINK_ERROR_POLICY="dlq", SINK_DLQ_TOPIC=dlq)
    code, out, _ = check_in_process(environ)
    assert code == 0, out
    warned = line(out, f"WARN dead-letter topic {dlq}")
    assert "does not exist yet; the broker creates it at the first dead letter" in warned
    assert dlq not in _topics(bootstrap)  # the validate-only create created nothing
    create_topics(bootstrap, {dlq: 1})
    code, out, _ = check_in_process(environ)
    assert code == 0 and line(out, f"OK dead-letter topic {dlq} (1 partition(s)")


def test_the_group_line_reports_committed_offsets_and_lag(bootstrap: str, ems: LocalEmsServer):
    from confluent_kafka import Producer

    from sink_service.kafka_source.offsets import KafkaOffsets

    name = f"check-lag-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: 1})
    producer = Producer({"bootstrap.servers": bootstrap})
    for _ in range(10):
        producer.produce(name, value=b"{}", partition=0)
    producer.flush(10)
    environ = ems_env(bootstrap, name, ems)
    KafkaOffsets({"bootstrap.servers": bootstrap}, environ["SINK_GROUP_ID"]).alter({(name, 0): 4})
    code, out, _ = check_in_process(environ)
    assert code == 0, out
    assert f"OK topic {name} (1 partition(s), 10 record(s)" in out
    assert "committed on 1 of 1 partition(s), lag 6" in line(out, "OK consumer group")


# --- S3 and dir ------------------------------------------------------------------------------------
def s3_env(bootstrap: str, topic: str, moto_url: str, bucket: str, prefix: str = "sink/data") -> dict[str, str]:
    return {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_TARGET": "s3",
            "SINK_S3_BUCKET": bucket, "SINK_S3_PREFIX": prefix, "SINK_S3_ENDPOINT_URL": moto_url,
            "SINK_S3_REGION": "us-east-1"}


def test_all_ok_on_moto_s3_and_the_probe_object_is_gone(bootstrap: str, topic: str, moto_url: str, aws_env: None):
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    bucket = f"check-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    code, out, _ = check_in_process(s3_env(bootstrap, topic, moto_url, bucket))
    assert code == 0, out
    ok = line(out, f"OK S3 target s3://{bucket}/sink/data")
    assert f"wrote and deleted s3://{bucket}/sink/data/_sink_check/" in ok
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert "testing-secret-key" not in out


def test_an_s3_bucket_that_does_not_exist_names_the_bucket_setting(bootstrap: str, topic: str, moto_url: str,
                                                                   aws_env: None):
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    code, out, _ = check_in_process(s3_env(bootstrap, topic, moto_url, bucket))
    assert code == 3
    failed = line(out, f"FAIL S3 target s3://{bucket}/sink/data")
    assert "NoSuchBucket" in failed and failed.endswith("— fix SINK_S3_BUCKET")


def test_an_unreachable_s3_endpoint_names_the_endpoint_setting(bootstrap: str, topic: str, aws_env: None):
    from devkit.brokers import free_port

    started = time.monotonic()
    code, out, _ = check_in_process(s3_env(bootstrap, topic, f"http://127.0.0.1:{free_port()}", "any"), timeout=4)
    assert code == 3 and time.monotonic() - started < 8
    assert "SINK_S3_ENDPOINT_URL" in line(out, "FAIL S3 target s3://any/sink/data")


def dir_env(bootstrap: str, topic: str, path: Path) -> dict[str, str]:
    return {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_TARGET": "dir",
            "SINK_DIR_PATH": str(path)}


def test_all_ok_on_a_directory_and_nothing_is_left_in_it(bootstrap: str, topic: str, tmp_path: Path):
    target = tmp_path / "out"
    target.mkdir()
    done = check_subprocess(dir_env(bootstrap, topic, target))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "created and removed a probe file" in line(done.stdout, f"OK dir target {target}")
    assert list(target.iterdir()) == []


def test_a_directory_under_a_file_names_the_path_setting(bootstrap: str, topic: str, tmp_path: Path):
    (tmp_path / "a-file").write_text("x")
    code, out, _ = check_in_process(dir_env(bootstrap, topic, tmp_path / "a-file" / "out"))
    assert code == 3
    assert line(out, "FAIL dir target").endswith("— fix SINK_DIR_PATH")
    code, out, _ = check_in_process(dir_env(bootstrap, topic, tmp_path / "a-file"))
    assert line(out, "FAIL dir target") == \
        f"FAIL dir target {tmp_path / 'a-file'}: is not a directory — fix SINK_DIR_PATH"


# --- schema registry -------------------------------------------------------------------------------
def test_the_schema_registry_reachable_and_its_credentials(bootstrap: str, topic: str, tmp_path: Path):
    registry = LocalRegistry(basic_auth="reader:registry-pass-123").start()
    try:
        environ = {**dir_env(bootstrap, topic, tmp_path), "SINK_VALUE_FORMAT": "avro",
                   "SINK_SCHEMA_REGISTRY_URL": registry.url,
                   "SINK_SCHEMA_REGISTRY_BASIC_AUTH": "reader:registry-pass-123"}
        code, out, _ = check_in_process(environ)
        assert code == 0, out
        assert "basic auth accepted" in line(out, f"OK schema registry {registry.url}")
        code, out, _ = check_in_process({**environ, "SINK_SCHEMA_REGISTRY_BASIC_AUTH": "reader:wrong-pass-456"})
        assert code == 3
        assert line(out, "FAIL schema registry").endswith("— fix SINK_SCHEMA_REGISTRY_BASIC_AUTH")
        assert "wrong-pass-456" not in out
    finally:
        registry.stop()


# --- configuration ---------------------------------------------------------------------------------
def test_a_configuration_error_is_exit_2_listing_every_problem():
    done = check_subprocess({"SINK_TOPICS": "orders", "SINK_TARGET": "s3", "SINK_FLUSH_RECORDS": "many",
                             "SINK_EMS_AUTHORIZATION": "AppKey do-not-print-me"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    for problem in ("SINK_KAFKA_BOOTSTRAP_SERVERS is required", "SINK_S3_BUCKET", "SINK_FLUSH_RECORDS=many"):
        assert problem in done.stderr
    assert "configuration problem(s)" in done.stderr and "do-not-print-me" not in done.stderr


def test_check_never_imports_spark(bootstrap: str, topic: str, tmp_path: Path):
    """The check runs where Spark would be too slow or absent (an init container, a laptop)."""
    script = ("import sys; from sink_service.cli.commands import main; code = main(['check']); "
              "spark = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')); "
              "print('SPARK', spark, code)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **dir_env(bootstrap, topic, tmp_path)})
    assert done.returncode == 0, done.stderr
    assert line(done.stdout, "SPARK") == "SPARK [] 0"


# --- the SASL/TLS broker ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def secured(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with running_secured_broker(bootstrap, {PASSWORD_USER: secrets.token_urlsafe(18)},
                                tmp_path_factory.mktemp("pki")) as broker:
        yield broker


def secured_env(broker: SecuredBroker, topic: str, path: Path, **overrides: str) -> dict[str, str]:
    return {**dir_env(broker.bootstrap, topic, path), "SINK_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "SINK_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "SINK_KAFKA_SASL_USERNAME": PASSWORD_USER,
            "SINK_KAFKA_SASL_PASSWORD": broker.users[PASSWORD_USER],
            "SINK_KAFKA_SSL_CA_LOCATION": str(broker.pki.ca_file), **overrides}


def test_all_ok_through_sasl_over_tls(secured: SecuredBroker, topic: str, tmp_path: Path):
    code, out, err = check_in_process(secured_env(secured, topic, tmp_path))
    assert code == 0, out + err
    assert line(out, "OK Kafka broker").startswith(f"OK Kafka broker {secured.bootstrap} (SASL_SSL, SCRAM-SHA-512)")
    assert secured.users[PASSWORD_USER] not in out + err


def test_a_wrong_sasl_password_names_the_sasl_settings_fast(secured: SecuredBroker, topic: str, tmp_path: Path):
    started = time.monotonic()
    done = check_subprocess(secured_env(secured, topic, tmp_path, SINK_KAFKA_SASL_PASSWORD="not-the-password-42"))
    elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    failed = line(done.stdout, "FAIL Kafka broker")
    assert "Kafka refused the login" in failed
    assert failed.endswith("— fix SINK_KAFKA_SASL_USERNAME/SINK_KAFKA_SASL_PASSWORD (and SINK_KAFKA_SASL_MECHANISM)")
    assert "not-the-password-42" not in done.stdout + done.stderr
    assert elapsed < 8, elapsed


def test_an_untrusted_ca_names_the_ca_setting(secured: SecuredBroker, topic: str, tmp_path: Path):
    code, out, _ = check_in_process(secured_env(secured, topic, tmp_path,
                                                SINK_KAFKA_SSL_CA_LOCATION=str(secured.pki.other_ca_file)))
    assert code == 3
    failed = line(out, "FAIL Kafka broker")
    assert "certificate does not verify" in failed and failed.endswith("— fix SINK_KAFKA_SSL_CA_LOCATION")
    assert secured.users[PASSWORD_USER] not in out


def _topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


# --- Delta -----------------------------------------------------------------------------------------
def delta_env(bootstrap: str, topic: str, uri: str, **more: str) -> dict[str, str]:
    return {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_TARGET": "delta",
            "SINK_DELTA_TABLE_URI": uri, "SINK_PRIMARY_KEYS": "id", **more}


def test_a_delta_table_on_a_directory_not_created_yet_then_existing(bootstrap: str, topic: str, tmp_path: Path):
    import pyarrow as pa
    from deltalake import write_deltalake

    uri = tmp_path / "tables" / "orders"
    code, out, _ = check_in_process(delta_env(bootstrap, topic, str(uri)))
    assert code == 0, out
    assert "not created yet" in line(out, f"OK Delta table {uri}")
    write_deltalake(str(uri), pa.table({"id": ["a"], "part": ["x"]}), partition_by=["part"])
    code, out, _ = check_in_process(delta_env(bootstrap, topic, str(uri)))
    assert code == 0, out
    assert "version 0, partitioned by part; created and removed a probe file" in line(out, f"OK Delta table {uri}")
    assert sorted(p.name for p in uri.iterdir()) == ["_delta_log", "part=x"]  # the probe left nothing


def test_a_delta_table_per_topic_and_one_under_a_file(bootstrap: str, topic: str, tmp_path: Path):
    code, out, _ = check_in_process(delta_env(bootstrap, topic, str(tmp_path / "t" / "{topic}")))
    assert code == 0 and line(out, f"OK Delta table {tmp_path / 't' / topic}"), out
    (tmp_path / "a-file").write_text("x")
    code, out, _ = check_in_process(delta_env(bootstrap, topic, str(tmp_path / "a-file" / "orders")))
    assert code == 3
    assert line(out, "FAIL Delta table").endswith("— fix SINK_DELTA_TABLE_URI")


def test_a_delta_table_on_moto_s3_and_a_missing_bucket(bootstrap: str, topic: str, moto_url: str, aws_env: None):
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    bucket = f"check-delta-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3_settings = {"SINK_S3_ENDPOINT_URL": moto_url, "SINK_S3_REGION": "us-east-1"}
    code, out, _ = check_in_process(delta_env(bootstrap, topic, f"s3://{bucket}/lake/orders", **s3_settings))
    assert code == 0, out
    ok = line(out, f"OK Delta table s3://{bucket}/lake/orders")
    assert "not created yet" in ok and f"wrote and deleted s3://{bucket}/lake/orders/_sink_check/" in ok
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    code, out, _ = check_in_process(delta_env(bootstrap, topic, f"s3://missing-{bucket}/lake/orders", **s3_settings))
    assert code == 3, out
    failed = line(out, f"FAIL Delta table s3://missing-{bucket}/lake/orders")
    assert "NoSuchBucket" in failed and failed.endswith("— fix SINK_DELTA_TABLE_URI"), out
    assert "testing-secret-key" not in out
