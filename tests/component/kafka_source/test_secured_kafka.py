"""Every Kafka client the service makes, against a broker that requires SASL over TLS with a private CA,
and against one that requires a client certificate (mutual TLS, `security.protocol=SSL`).

The broker is the session's broker behind `devkit.secured_broker` (SCRAM-SHA-256, SCRAM-SHA-512 and
PLAIN over TLS; see there why not tansu). Client settings are built exactly as the service builds them:
`load_config` over SINK_* variables, then `kafka_client_config()`. Records are produced one per batch
(flushed after each) so that brokers whose watermark counts batches (tansu) give the same answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import re
import secrets
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from devkit.kafka_data import create_topics
from devkit.secured_broker import CLIENT_COMMON_NAME, SaslGateway, SecuredBroker, running_secured_broker
from sink_service.cli import check
from sink_service.config import MASK, load_config
from sink_service.kafka_source.membership import GroupMembership
from sink_service.kafka_source.offsets import KafkaOffsets
from sink_service.shared.kafka_access import KafkaAccessRefused
from sink_service.task import dead_letters, range_reader
from sink_service.task.dead_letters import DeadLetterSpec
from sink_service.task.partition_task import process_range
from sink_service.task.range_reader import consumer_config, read_range
from sink_service.task.ranges import Range
from tests.component.task.test_dead_letters import reader
from tests.component.task.test_dead_letters import spec as dead_letter_task

USER = "sink-service"
MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
RECORDS = 30


@pytest.fixture(scope="module")
def secured(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with running_secured_broker(bootstrap, {USER: secrets.token_urlsafe(18)},
                                tmp_path_factory.mktemp("pki")) as broker:
        yield broker


@pytest.fixture(autouse=True)
def no_cached_clients() -> Iterator[None]:
    """The range reader and the dead-letter producer cache clients per process: none outlives a test."""
    yield
    for consumer in range_reader._consumers.values():
        consumer.close()
    range_reader._consumers.clear()
    for producer in dead_letters._producers.values():
        producer.flush(5)
    dead_letters._producers.clear()


def service_client_config(broker: SecuredBroker, mechanism: str, **overrides: str) -> dict[str, str]:
    """The librdkafka settings the service derives from its environment."""
    environ = {
        "SINK_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "SINK_TOPICS": "orders",
        "SINK_TARGET": "dir",
        "SINK_DIR_PATH": "/tmp/unused",
        "SINK_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "SINK_KAFKA_SASL_MECHANISM": mechanism,
        "SINK_KAFKA_SASL_USERNAME": USER,
        "SINK_KAFKA_SASL_PASSWORD": broker.users[USER],
        "SINK_KAFKA_SSL_CA_LOCATION": str(broker.pki.ca_file),
        **overrides,
    }
    return load_config(environ).kafka_client_config()


def produce_one_per_batch(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=json.dumps({"id": str(i), "version": i}).encode(),
                         partition=0)
        producer.flush(10)


def new_topic(broker: SecuredBroker, stem: str, partitions: int = 1, records: int = RECORDS) -> str:
    topic = f"{stem}-{uuid.uuid4().hex[:8]}"
    create_topics(broker.backend, {topic: partitions})
    produce_one_per_batch(broker.backend, topic, records)
    return topic


def assert_logged_in(broker: SecuredBroker, mechanism: str, since: float) -> None:
    logins = {(e.user, e.mechanism) for e in broker.gateway.logins() if e.at >= since}
    assert (USER, mechanism) in logins, f"no {mechanism} login by {USER} through the secured listener: {logins}"


def test_the_broker_refuses_a_client_that_does_not_authenticate(secured: SecuredBroker):
    """Proof that the listener requires authentication: TLS alone (no SASL) gets no metadata."""
    config = {"bootstrap.servers": secured.bootstrap, "security.protocol": "SSL",
              "ssl.ca.location": str(secured.pki.ca_file), "log_level": 0}
    with pytest.raises(KafkaException):
        AdminClient(config).list_topics(timeout=3)
    assert any(e.outcome == "closed" for e in secured.gateway.events)


def test_the_service_settings_become_sasl_ssl_client_settings(secured: SecuredBroker):
    config = service_client_config(secured, "SCRAM-SHA-512")
    assert config == {"bootstrap.servers": secured.bootstrap, "security.protocol": "SASL_SSL",
                      "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER,
                      "sasl.password": secured.users[USER], "ssl.ca.location": str(secured.pki.ca_file)}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_offsets_client_authenticates(secured: SecuredBroker, mechanism: str):
    topic = new_topic(secured, "secured-offsets")
    since = time.monotonic()
    offsets = KafkaOffsets(service_client_config(secured, mechanism), f"group-{topic}")
    tp = (topic, 0)
    assert offsets.earliest([tp]) == {tp: 0}
    assert offsets.latest([tp]) == {tp: RECORDS}
    assert offsets.committed([tp]) == {}
    committed: list[dict] = []
    assert offsets.resolve_start([tp], "earliest", "fail", committed.append) == {tp: 0}
    assert_logged_in(secured, mechanism, since)


def assert_member_joins_and_commits(config: dict, topic: str, group: str) -> None:
    """The service's group member gets both partitions of `topic` through the secured listener and
    commits; the commit is read back with the offsets client on the same settings."""
    member = GroupMembership(config, group, [topic], 30_000, lambda: True, 10, f"instance-{topic}")
    member.start()
    try:
        settled = member.wait_assignment(30)
        assert settled is not None, f"no assignment through the secured listener: {member.failure}"
        assigned, epoch = settled
        assert assigned == {(topic, 0), (topic, 1)}
        member.commit({(topic, 0): 0, (topic, 1): 0}, epoch)
    finally:
        member.close()
    assert KafkaOffsets(config, group).committed([(topic, 0), (topic, 1)]) == {(topic, 0): 0, (topic, 1): 0}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_group_member_authenticates_and_commits(secured: SecuredBroker, mechanism: str):
    topic = new_topic(secured, "secured-member", partitions=2, records=0)
    group = f"group-{topic}"
    since = time.monotonic()
    assert_member_joins_and_commits(service_client_config(secured, mechanism), topic, group)
    assert_logged_in(secured, mechanism, since)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_range_reader_authenticates(secured: SecuredBroker, mechanism: str):
    topic = new_topic(secured, "secured-reader")
    since = time.monotonic()
    config = consumer_config(service_client_config(secured, mechanism), f"reader-{topic}")
    batches = list(read_range(Range(topic, 0, 5, RECORDS), config, 1 << 30))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(5, RECORDS))
    assert_logged_in(secured, mechanism, since)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_dead_letter_producer_authenticates(secured: SecuredBroker, mechanism: str, tmp_path: Path):
    dlq = f"secured-dlq-{uuid.uuid4().hex[:8]}"
    create_topics(secured.backend, {dlq: 1})
    since = time.monotonic()
    task = dataclasses.replace(dead_letter_task(tmp_path, secured.bootstrap, dlq),
                               dead_letters=DeadLetterSpec.of(dlq, service_client_config(secured, mechanism)))
    outcome = process_range(task, Range("src", 3, 0, 300), reader(300, {7, 150})).to_pylist()[0]
    assert (outcome["status"], outcome["committable"]) == ("ok", 300), outcome["error"]
    assert json.loads(outcome["dead_letters"]) == {"invalid_json": 1, "missing_key": 1}
    consumer = Consumer({"bootstrap.servers": secured.backend, "group.id": f"check-{dlq}"})
    consumer.assign([TopicPartition(dlq, 0, 0)])
    letters = consumer.consume(10, timeout=5)
    consumer.close()
    assert sorted(int(dict(m.headers())["sink.source.offset"]) for m in letters if m.error() is None) == [7, 150]
    assert_logged_in(secured, mechanism, since)


FAULTS = {
    "wrong-password": ({"SINK_KAFKA_SASL_PASSWORD": "not-the-password"}, "_AUTHENTICATION"),
    "unknown-user": ({"SINK_KAFKA_SASL_USERNAME": "nobody"}, "_AUTHENTICATION"),
    "untrusted-ca": ({}, "_SSL"),  # the CA is set below: it needs the fixture
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_bad_credential_or_ca_is_reported_by_librdkafka_at_once(secured: SecuredBroker, fault: str):
    """What a fatal-vs-retry classification can rely on: librdkafka reports the cause through
    `error_cb` within a second (codes -169 _AUTHENTICATION and -181 _SSL, neither fatal() nor
    retriable()), then only `_ALL_BROKERS_DOWN` and timeouts, like an unreachable broker.
    The service sets no `error_cb` today: see the report of issue 27 for what each client does."""
    overrides, expected = FAULTS[fault]
    if fault == "untrusted-ca":
        overrides = {"SINK_KAFKA_SSL_CA_LOCATION": str(secured.pki.other_ca_file)}
    seen: list[tuple[float, str, str]] = []
    start = time.monotonic()
    config = {**service_client_config(secured, "SCRAM-SHA-512", **overrides), "log_level": 0,
              "error_cb": lambda e: seen.append((time.monotonic() - start, e.name(), e.str()))}
    admin = AdminClient(config)
    while time.monotonic() - start < 5 and not any(name == expected for _t, name, _s in seen):
        admin.poll(0.1)
    first = next(((t, text) for t, name, text in seen if name == expected), None)
    assert first is not None, f"no {expected} error within 5 s: {seen}"
    assert first[0] < 2, f"{expected} after {first[0]:.1f}s"
    if expected == "_SSL":
        assert "certificate verify failed" in first[1]
    else:
        assert "invalid credentials" in first[1]
        assert secured.users[USER] not in first[1]


# --- a refused login or certificate ends each client at once, naming the setting to fix -------------

SETTING_TO_FIX = {"wrong-password": "SINK_KAFKA_SASL_PASSWORD", "unknown-user": "SINK_KAFKA_SASL_USERNAME",
                  "untrusted-ca": "SINK_KAFKA_SSL_CA_LOCATION"}


def refused_client_config(secured: SecuredBroker, fault: str) -> dict[str, str]:
    overrides, _ = FAULTS[fault]
    if fault == "untrusted-ca":
        overrides = {"SINK_KAFKA_SSL_CA_LOCATION": str(secured.pki.other_ca_file)}
    return {**service_client_config(secured, "SCRAM-SHA-512", **overrides), "log_level": "0"}


@pytest.mark.parametrize("fault", FAULTS)
def test_the_offsets_client_stops_at_a_refusal_naming_the_setting(secured: SecuredBroker, fault: str):
    offsets = KafkaOffsets(refused_client_config(secured, fault), "refused-group")
    start = time.monotonic()
    with pytest.raises(KafkaAccessRefused, match=SETTING_TO_FIX[fault]) as refused:
        offsets.latest([("orders", 0)])
    assert time.monotonic() - start < 5, "waited for the request timeout instead of the refusal"
    assert secured.users[USER] not in str(refused.value)


@pytest.mark.parametrize("fault", FAULTS)
def test_the_group_member_fails_at_a_refusal_naming_the_setting(secured: SecuredBroker, fault: str):
    member = GroupMembership(refused_client_config(secured, fault), f"refused-{fault}", ["orders"], 30_000,
                             lambda: True, 10, f"instance-refused-{fault}")
    member.start()
    try:
        assert member.wait_assignment(10) is None
        assert member.failure is not None and SETTING_TO_FIX[fault] in member.failure, member.failure
    finally:
        member.close()


@pytest.mark.parametrize("fault", FAULTS)
def test_the_range_reader_stops_at_a_refusal_naming_the_setting(secured: SecuredBroker, fault: str):
    config = consumer_config(refused_client_config(secured, fault), f"refused-reader-{fault}")
    start = time.monotonic()
    with pytest.raises(KafkaAccessRefused, match=SETTING_TO_FIX[fault]):
        list(read_range(Range("orders", 0, 0, 10), config, 1 << 30))
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("fault", FAULTS)
def test_the_dead_letter_producer_stops_the_range_at_a_refusal(secured: SecuredBroker, fault: str, tmp_path: Path):
    task = dataclasses.replace(dead_letter_task(tmp_path, secured.bootstrap, "refused-dlq"),
                               dead_letters=DeadLetterSpec.of("refused-dlq", refused_client_config(secured, fault)))
    start = time.monotonic()
    outcome = process_range(task, Range("src", 3, 0, 300), reader(300, {7})).to_pylist()[0]
    assert outcome["status"] == "fatal", outcome
    assert SETTING_TO_FIX[fault] in outcome["error"], outcome["error"]
    assert outcome["committable"] <= 7
    assert time.monotonic() - start < 10


# --- mutual TLS: a broker that requires a client certificate (security.protocol=SSL) ----------------
# The client certificate's settings pass through as SINK_KAFKA_SSL_CERTIFICATE_LOCATION,
# SINK_KAFKA_SSL_KEY_LOCATION and SINK_KAFKA_SSL_KEY_PASSWORD (secret), like the SASL ones.

@pytest.fixture(scope="module")
def mtls(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with running_secured_broker(bootstrap, None, tmp_path_factory.mktemp("mtls-pki"), mutual_tls=True,
                                sasl=False) as broker:
        yield broker


def mtls_environ(broker: SecuredBroker, topics: str = "orders", **overrides: str | None) -> dict[str, str]:
    """SINK_* variables for the SSL listener, with the encrypted client key; None drops a variable."""
    pki = broker.pki
    environ = {
        "SINK_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "SINK_TOPICS": topics, "SINK_TARGET": "dir",
        "SINK_DIR_PATH": "/tmp/unused", "SINK_KAFKA_SECURITY_PROTOCOL": "SSL",
        "SINK_KAFKA_SSL_CA_LOCATION": str(pki.ca_file),
        "SINK_KAFKA_SSL_CERTIFICATE_LOCATION": str(pki.client_cert_file),
        "SINK_KAFKA_SSL_KEY_LOCATION": str(pki.client_encrypted_key_file),
        "SINK_KAFKA_SSL_KEY_PASSWORD": pki.client_key_password,
        **overrides,
    }
    return {name: value for name, value in environ.items() if value is not None}


def mtls_config(broker: SecuredBroker, **overrides: str | None) -> dict[str, str]:
    return load_config(mtls_environ(broker, **overrides)).kafka_client_config()


def assert_certificate_login(broker: SecuredBroker, since: float) -> None:
    logins = {(e.user, e.mechanism) for e in broker.gateway.logins() if e.at >= since}
    assert (CLIENT_COMMON_NAME, "SSL") in logins, f"no login with the client certificate: {logins}"


def test_the_mtls_broker_refuses_a_client_without_a_certificate(mtls: SecuredBroker):
    """Proof that the listener requires a client certificate: TLS with the right CA alone gets nothing."""
    since = time.monotonic()
    config = {**mtls_config(mtls, SINK_KAFKA_SSL_CERTIFICATE_LOCATION=None, SINK_KAFKA_SSL_KEY_LOCATION=None,
                            SINK_KAFKA_SSL_KEY_PASSWORD=None), "log_level": 0}
    with pytest.raises(KafkaException):
        AdminClient(config).list_topics(timeout=3)
    refused = [e.detail for e in mtls.gateway.events if e.at >= since and e.outcome == "refused"]
    assert refused and "PEER_DID_NOT_RETURN_A_CERTIFICATE" in refused[0], refused


def test_the_mtls_settings_become_client_settings_with_the_key_password_secret(mtls: SecuredBroker):
    pki = mtls.pki
    config = load_config(mtls_environ(mtls))
    assert config.kafka_client_config() == {
        "bootstrap.servers": mtls.bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca_file),
        "ssl.certificate.location": str(pki.client_cert_file),
        "ssl.key.location": str(pki.client_encrypted_key_file), "ssl.key.password": pki.client_key_password}
    assert config.masked()["SINK_KAFKA_SSL_KEY_PASSWORD"] == MASK
    assert pki.client_key_password not in json.dumps(config.masked())


def test_the_offsets_client_authenticates_with_the_certificate(mtls: SecuredBroker):
    topic = new_topic(mtls, "mtls-offsets")
    since = time.monotonic()
    offsets = KafkaOffsets(mtls_config(mtls), f"group-{topic}")
    tp = (topic, 0)
    assert offsets.earliest([tp]) == {tp: 0}
    assert offsets.latest([tp]) == {tp: RECORDS}
    assert offsets.committed([tp]) == {}
    assert_certificate_login(mtls, since)


def test_the_group_member_authenticates_with_the_certificate_and_commits(mtls: SecuredBroker):
    topic = new_topic(mtls, "mtls-member", partitions=2, records=0)
    group = f"group-{topic}"
    since = time.monotonic()
    assert_member_joins_and_commits(mtls_config(mtls), topic, group)
    assert_certificate_login(mtls, since)


def test_the_range_reader_authenticates_with_the_certificate(mtls: SecuredBroker):
    topic = new_topic(mtls, "mtls-reader")
    since = time.monotonic()
    config = consumer_config(mtls_config(mtls), f"reader-{topic}")
    batches = list(read_range(Range(topic, 0, 5, RECORDS), config, 1 << 30))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(5, RECORDS))
    assert_certificate_login(mtls, since)


def test_the_dead_letter_producer_authenticates_with_the_certificate(mtls: SecuredBroker, tmp_path: Path):
    dlq = f"mtls-dlq-{uuid.uuid4().hex[:8]}"
    create_topics(mtls.backend, {dlq: 1})
    since = time.monotonic()
    task = dataclasses.replace(dead_letter_task(tmp_path, mtls.bootstrap, dlq),
                               dead_letters=DeadLetterSpec.of(dlq, mtls_config(mtls)))
    outcome = process_range(task, Range("src", 3, 0, 300), reader(300, {7, 150})).to_pylist()[0]
    assert (outcome["status"], outcome["committable"]) == ("ok", 300), outcome["error"]
    consumer = Consumer({"bootstrap.servers": mtls.backend, "group.id": f"check-{dlq}"})
    consumer.assign([TopicPartition(dlq, 0, 0)])
    letters = consumer.consume(10, timeout=5)
    consumer.close()
    assert sorted(int(dict(m.headers())["sink.source.offset"]) for m in letters if m.error() is None) == [7, 150]
    assert_certificate_login(mtls, since)


def run_check(environ: dict[str, str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = check.run(argparse.Namespace(json=False, timeout=10.0), environ, out, err)
    return code, out.getvalue() + err.getvalue()


def test_check_authenticates_with_the_certificate(mtls: SecuredBroker, tmp_path: Path):
    topic = new_topic(mtls, "mtls-check")
    since = time.monotonic()
    code, out = run_check(mtls_environ(mtls, topic, SINK_DIR_PATH=str(tmp_path)))
    assert code == 0, out
    assert f"OK Kafka broker {mtls.bootstrap} (SSL)" in out
    assert f"OK topic {topic} (1 partition(s), {RECORDS} record(s)" in out
    assert mtls.pki.client_key_password not in out
    assert_certificate_login(mtls, since)


# Each fault: the SINK_* overrides, and the setting the stop names.
MTLS_FAULTS = {
    "no-client-certificate": ({"SINK_KAFKA_SSL_CERTIFICATE_LOCATION": None, "SINK_KAFKA_SSL_KEY_LOCATION": None,
                               "SINK_KAFKA_SSL_KEY_PASSWORD": None}, "SINK_KAFKA_SSL_CERTIFICATE_LOCATION"),
    "certificate-of-another-ca": ({"SINK_KAFKA_SSL_KEY_PASSWORD": None}, "SINK_KAFKA_SSL_CERTIFICATE_LOCATION"),
    "wrong-key-password": ({"SINK_KAFKA_SSL_KEY_PASSWORD": "not-the-key-password-1234"},
                           "SINK_KAFKA_SSL_KEY_PASSWORD"),
}


def mtls_fault_environ(broker: SecuredBroker, fault: str, topics: str = "orders") -> dict[str, str]:
    overrides, _ = MTLS_FAULTS[fault]
    if fault == "certificate-of-another-ca":
        overrides = {**overrides, "SINK_KAFKA_SSL_CERTIFICATE_LOCATION": str(broker.pki.other_client_cert_file),
                     "SINK_KAFKA_SSL_KEY_LOCATION": str(broker.pki.other_client_key_file)}
    return mtls_environ(broker, topics, **overrides)


def mtls_fault_config(broker: SecuredBroker, fault: str) -> dict[str, str]:
    return {**load_config(mtls_fault_environ(broker, fault)).kafka_client_config(), "log_level": "0"}


def assert_names_the_setting(message: str, fault: str, broker: SecuredBroker) -> None:
    assert MTLS_FAULTS[fault][1] in message, message
    assert broker.pki.client_key_password not in message and "not-the-key-password-1234" not in message


@pytest.mark.parametrize("fault", MTLS_FAULTS)
def test_the_offsets_client_stops_at_a_refused_certificate_naming_the_setting(mtls: SecuredBroker, fault: str):
    start = time.monotonic()
    with pytest.raises(KafkaAccessRefused) as refused:
        KafkaOffsets(mtls_fault_config(mtls, fault), "refused-group").latest([("orders", 0)])
    assert time.monotonic() - start < 5, "waited for the request timeout instead of the refusal"
    assert_names_the_setting(str(refused.value), fault, mtls)


@pytest.mark.parametrize("fault", MTLS_FAULTS)
def test_the_group_member_fails_at_a_refused_certificate_naming_the_setting(mtls: SecuredBroker, fault: str):
    """A client librdkafka cannot make (the key does not decrypt) is refused when it is made; one the
    broker refuses ends the member thread: either way the service stops with the member's failure."""
    start = time.monotonic()
    try:
        member = GroupMembership(mtls_fault_config(mtls, fault), f"refused-{fault}", ["orders"], 30_000,
                                 lambda: True, 10, f"instance-refused-{fault}")
    except KafkaAccessRefused as exc:
        failure: str | None = str(exc)
    else:
        member.start()
        try:
            assert member.wait_assignment(10) is None
            failure = member.failure
        finally:
            member.close()
    assert failure is not None
    assert time.monotonic() - start < 10
    assert_names_the_setting(failure, fault, mtls)


@pytest.mark.parametrize("fault", MTLS_FAULTS)
def test_the_range_reader_stops_at_a_refused_certificate_naming_the_setting(mtls: SecuredBroker, fault: str):
    config = consumer_config(mtls_fault_config(mtls, fault), f"refused-reader-{fault}")
    start = time.monotonic()
    with pytest.raises(KafkaAccessRefused) as refused:
        list(read_range(Range("orders", 0, 0, 10), config, 1 << 30))
    assert time.monotonic() - start < 5
    assert_names_the_setting(str(refused.value), fault, mtls)


@pytest.mark.parametrize("fault", MTLS_FAULTS)
def test_the_dead_letter_producer_stops_the_range_at_a_refused_certificate(mtls: SecuredBroker, fault: str,
                                                                          tmp_path: Path):
    task = dataclasses.replace(dead_letter_task(tmp_path, mtls.bootstrap, "refused-dlq"),
                               dead_letters=DeadLetterSpec.of("refused-dlq", mtls_fault_config(mtls, fault)))
    start = time.monotonic()
    outcome = process_range(task, Range("src", 3, 0, 300), reader(300, {7})).to_pylist()[0]
    assert outcome["status"] == "fatal", outcome
    assert_names_the_setting(outcome["error"], fault, mtls)
    assert outcome["committable"] <= 7
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("fault", MTLS_FAULTS)
def test_check_fails_at_a_refused_certificate_naming_the_setting(mtls: SecuredBroker, fault: str, tmp_path: Path):
    start = time.monotonic()
    code, out = run_check({**mtls_fault_environ(mtls, fault), "SINK_DIR_PATH": str(tmp_path)})
    assert code == 3, out
    failed = [text for text in out.splitlines() if text.startswith("FAIL Kafka broker")]
    assert len(failed) == 1, out
    assert failed[0].endswith(f"— fix {MTLS_FAULTS[fault][1]}"), failed[0]
    assert_names_the_setting(out, fault, mtls)
    assert time.monotonic() - start < 8


def test_the_service_stops_at_once_when_the_key_does_not_decrypt(mtls: SecuredBroker, tmp_path: Path):
    """The whole service, as a process: a wrong key password is one `stopping:` line and exit 3, before
    Spark starts (librdkafka cannot make the first client), never a traceback."""
    environ = {**mtls_fault_environ(mtls, "wrong-key-password"), "SINK_DIR_PATH": str(tmp_path / "out"),
               "SINK_SCRATCH_DIR": str(tmp_path / "scratch"), "SINK_HTTP_PORT": "0", "PATH": "/usr/bin:/bin",
               "HOME": str(tmp_path)}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sink_service"], capture_output=True, text=True, timeout=60,
                          env=environ)
    assert done.returncode == 3, done.stderr[-3000:]
    assert time.monotonic() - start < 30
    stopping = [text for text in done.stderr.splitlines() if "stopping:" in text]
    assert len(stopping) == 1 and "SINK_KAFKA_SSL_KEY_PASSWORD" in stopping[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "not-the-key-password-1234" not in done.stdout + done.stderr


@pytest.mark.parametrize("fault", ["no-client-certificate", "certificate-of-another-ca"])
def test_a_refused_certificate_under_tls_1_2_is_refused_too(mtls: SecuredBroker, fault: str):
    """Under TLS 1.2 the refusal ends the handshake (`_SSL`: "alert handshake failure" for no certificate
    from an OpenSSL broker, "alert unknown ca"), not the first read after it (`_TRANSPORT`, TLS 1.3)."""
    gateway = SaslGateway(mtls.backend, {}, mtls.pki, client_ca=mtls.pki.ca_file, sasl=False,
                          tls_max_version=ssl.TLSVersion.TLSv1_2).start()
    try:
        config = {**mtls_fault_config(mtls, fault), "bootstrap.servers": gateway.bootstrap}
        start = time.monotonic()
        with pytest.raises(KafkaAccessRefused) as refused:
            KafkaOffsets(config, "refused-group").latest([("orders", 0)])
        assert time.monotonic() - start < 5
        assert_names_the_setting(str(refused.value), fault, mtls)
        # which of the two handshake errors librdkafka reports first varies from run to run
        assert re.search(r"SSL handshake failed|SSL routines", str(refused.value)), str(refused.value)
    finally:
        gateway.stop()
