"""Every Kafka client the service makes, against a broker that requires SASL over TLS with a private CA.

The broker is the session's broker behind `devkit.secured_broker` (SCRAM-SHA-256, SCRAM-SHA-512 and
PLAIN over TLS; see there why not tansu). Client settings are built exactly as the service builds them:
`load_config` over SINK_* variables, then `kafka_client_config()`. Records are produced one per batch
(flushed after each) so that brokers whose watermark counts batches (tansu) give the same answers.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from devkit.kafka_data import create_topics
from devkit.secured_broker import SecuredBroker, running_secured_broker
from sink_service.config import load_config
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


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_group_member_authenticates_and_commits(secured: SecuredBroker, mechanism: str):
    topic = new_topic(secured, "secured-member", partitions=2, records=0)
    group = f"group-{topic}"
    since = time.monotonic()
    config = service_client_config(secured, mechanism)
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
