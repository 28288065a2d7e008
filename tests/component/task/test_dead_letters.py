"""SINK_ERROR_POLICY=dlq in a task against a real broker: bad records leave unchanged, and no offset
is committable past a dead letter the topic has not acknowledged."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.kafka_data import create_topics
from sink_service.config import load_config
from sink_service.config.upload_targets import build_target
from sink_service.decode import RAW_SCHEMA, BadRecord, DecodeSpec
from sink_service.task import dead_letters
from sink_service.task.dead_letters import DeadLetterSpec, dead_letter_headers, original_headers
from sink_service.task.outcomes import ERROR_DEAD_LETTER
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.ranges import Range
from tests.support.config_helpers import config_problems, ems_env
from tests.unit.task.test_partition_task import spec as task_spec

HEADERS = [("trace", b"abc"), ("empty", None), ("trace", b"\xff\x00binary")]
INVALID_TOPIC = "x" * 250  # longer than Kafka allows: every broker refuses it


@pytest.fixture(autouse=True)
def fresh_producers() -> Iterator[None]:
    """Producers are cached per process; each test starts and ends without one."""
    yield
    for producer in dead_letters._producers.values():
        producer.flush(5)
    dead_letters._producers.clear()


def spec(tmp_path: Path, bootstrap: str, dlq: str, flush_records: int = 100) -> TaskSpec:
    return dataclasses.replace(task_spec(tmp_path, "dlq", flush_records),
                               dead_letters=DeadLetterSpec.of(dlq, {"bootstrap.servers": bootstrap}))


def value(i: int, bad: set[int]) -> bytes:
    if i in bad:
        return b'{"id": "broken' if i % 2 else json.dumps({"version": i}).encode()  # invalid JSON; no key
    return json.dumps({"id": str(i), "version": i}).encode()


def reader(n: int, bad: set[int], batch: int = 50):
    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        for start in range(rng.start, min(rng.end, n), batch):
            offsets = range(start, min(start + batch, rng.end))
            yield pa.RecordBatch.from_pylist([
                {"topic": "src", "partition": 3, "offset": i, "timestamp_ms": 1_700_000_000_000 + i,
                 "key": f"k{i}".encode(), "value": value(i, bad),
                 "headers": [{"key": k, "value": v} for k, v in HEADERS]}
                for i in offsets], schema=RAW_SCHEMA)
    return read


def dead_letter_records(bootstrap: str, topic: str) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dlq-reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    records = []
    while batch := consumer.consume(100, timeout=3):
        records += [m for m in batch if m.error() is None]
    consumer.close()
    return records


def test_headers_keep_the_original_ones_first_then_say_where_and_why():
    record = BadRecord("src", 3, 42, "invalid JSON: " + "x" * 10_000, "invalid_json")
    headers = dead_letter_headers(record, 1_700_000_000_123, HEADERS)
    assert headers[:3] == HEADERS
    named = dict(headers[3:])
    assert named.keys() == {"sink.error.kind", "sink.error.message", "sink.source.topic", "sink.source.partition",
                            "sink.source.offset", "sink.source.timestamp"}
    assert (named["sink.error.kind"], named["sink.source.topic"]) == (b"invalid_json", b"src")
    assert (named["sink.source.partition"], named["sink.source.offset"]) == (b"3", b"42")
    assert named["sink.source.timestamp"] == b"1700000000123"
    assert named["sink.error.message"].startswith(b"invalid JSON: xxx")
    assert len(named["sink.error.message"]) == dead_letters.MAX_MESSAGE_BYTES
    assert original_headers(headers) == HEADERS


def test_bad_records_reach_the_dead_letter_topic_unchanged_before_the_range_is_committable(bootstrap, tmp_path):
    dlq = "dlq-unit-ok"
    create_topics(bootstrap, {dlq: 1})
    bad = {7, 120, 121, 250}
    outcome = process_range(spec(tmp_path, bootstrap, dlq), Range("src", 3, 0, 300), reader(300, bad)).to_pylist()[0]
    assert outcome["status"] == "ok", outcome["error"]
    assert outcome["committable"] == 300
    assert json.loads(outcome["dead_letters"]) == {"invalid_json": 2, "missing_key": 2}
    records = dead_letter_records(bootstrap, dlq)
    assert [int(dict(m.headers())["sink.source.offset"]) for m in records] == sorted(bad)
    for m in records:
        offset = int(dict(m.headers())["sink.source.offset"])
        assert (m.key(), m.value()) == (f"k{offset}".encode(), value(offset, bad))
        assert original_headers(m.headers()) == HEADERS
        assert dict(m.headers())["sink.source.timestamp"] == str(1_700_000_000_000 + offset).encode()
        assert dict(m.headers())["sink.error.kind"] == (b"invalid_json" if offset % 2 else b"missing_key")


@pytest.mark.parametrize("read_batch", [50, 300], ids=["bad-record-read-later", "one-read-for-all"])
def test_a_dead_letter_topic_that_refuses_holds_the_range_before_the_bad_record(bootstrap, tmp_path, read_batch):
    """Only dead letters below the next committable offset hold it: the file before one is done.
    A name the broker refuses is permanent: fatal, naming the setting to fix, never an endless replay."""
    outcome = process_range(spec(tmp_path, bootstrap, INVALID_TOPIC), Range("src", 3, 0, 300),
                            reader(300, {150}, read_batch)).to_pylist()[0]
    assert outcome["status"] == "fatal"
    assert outcome["error_kind"] == ERROR_DEAD_LETTER
    assert outcome["committable"] == 100, "the file before the bad record's is done; nothing past it"
    assert "offset=150" in outcome["error"] and "dead-letter topic" in outcome["error"]
    assert "SINK_DLQ_TOPIC" in outcome["error"] and "name" in outcome["error"]
    assert json.loads(outcome["dead_letters"]) == {}


def test_a_missing_dead_letter_topic_the_broker_will_not_create_is_fatal(bootstrap, tmp_path):
    """Auto-creation off (here on the client: noida-db always creates): the broker says the topic does not exist."""
    task = dataclasses.replace(spec(tmp_path, bootstrap, "dlq-unit-never-created"), dead_letters=DeadLetterSpec.of(
        "dlq-unit-never-created", {"bootstrap.servers": bootstrap, "allow.auto.create.topics": "false"}))
    outcome = process_range(task, Range("src", 3, 0, 300), reader(300, {150})).to_pylist()[0]
    assert (outcome["status"], outcome["error_kind"], outcome["committable"]) == ("fatal", ERROR_DEAD_LETTER, 100)
    assert "SINK_DLQ_TOPIC" in outcome["error"] and "does not exist" in outcome["error"], outcome["error"]


def test_a_keyless_dead_letter_to_a_compacted_topic_is_fatal(bootstrap, tmp_path):
    dlq = "dlq-unit-compacted"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(dlq, 1, 1, config={"cleanup.policy": "compact"})])[dlq].result()

    def keyless(rng: Range) -> Iterator[pa.RecordBatch]:
        for batch in reader(300, {150})(rng):
            yield batch.set_column(4, "key", pa.nulls(batch.num_rows, pa.binary()))

    outcome = process_range(spec(tmp_path, bootstrap, dlq), Range("src", 3, 0, 300), keyless).to_pylist()[0]
    assert (outcome["status"], outcome["error_kind"], outcome["committable"]) == ("fatal", ERROR_DEAD_LETTER, 100)
    assert "SINK_DLQ_TOPIC" in outcome["error"] and "cleanup.policy" in outcome["error"], outcome["error"]


@pytest.mark.parametrize("code", [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED])
def test_an_authorisation_refusal_is_fatal_and_says_what_to_grant(code):
    """noida-db has no ACLs: the broker's answer is built here, the decision is the one the task takes."""
    why = dead_letters.refusal(KafkaError(code), "dlq", has_key=True)
    assert why is not None and "SINK_DLQ_TOPIC" in why and "Write" in why
    assert dead_letters.refusal(KafkaError(KafkaError._MSG_TIMED_OUT), "dlq", has_key=True) is None, \
        "an unreachable broker stays an outage"
    assert dead_letters.refusal(KafkaError(KafkaError._TRANSPORT), "dlq", has_key=True) is None


def test_a_dead_letter_larger_than_the_topic_takes_is_truncated_and_says_so(bootstrap, tmp_path):
    """The source allows more than the dead-letter topic (noida-db honours max.message.bytes per topic)."""
    dlq = "dlq-unit-small"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(dlq, 1, 1, config={"max.message.bytes": "10000"})])[dlq].result()
    big = b'{"id": "' + b"y" * 50_000  # invalid JSON, 50 kB
    mid = {i: b'{"id": "' + bytes([97 + i % 26]) * 3_000 for i in range(60, 66)}  # fit alone, not together

    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist([
            {"topic": "src", "partition": 3, "offset": i, "timestamp_ms": 0, "key": f"k{i}".encode(),
             "value": big if i == 150 else mid.get(i, json.dumps({"id": str(i)}).encode()),
             "headers": [{"key": k, "value": v} for k, v in HEADERS]}
            for i in range(rng.start, rng.end)], schema=RAW_SCHEMA)

    outcome = process_range(spec(tmp_path, bootstrap, dlq), Range("src", 3, 0, 300), read).to_pylist()[0]
    assert (outcome["status"], outcome["committable"]) == ("ok", 300), outcome["error"]
    assert json.loads(outcome["dead_letters"]) == {"invalid_json": 7}
    letters = {int(dict(m.headers())["sink.source.offset"]): m for m in dead_letter_records(bootstrap, dlq)}
    assert sorted(letters) == [*mid, 150]
    for offset, value_was in mid.items():  # refused together in one batch at most: each sent again, unchanged
        assert (letters[offset].value(), original_headers(letters[offset].headers())) == (value_was, HEADERS)
        assert "sink.truncated" not in dict(letters[offset].headers())
    cut = letters[150]
    named = dict(cut.headers())
    assert named["sink.truncated"] == b"true"
    assert named["sink.original.value.bytes"] == str(len(big)).encode()
    assert named["sink.original.key.bytes"] == b"4"
    assert cut.key() == b"k150" and original_headers(cut.headers()) == HEADERS
    assert big.startswith(cut.value()) and 1_000 < len(cut.value()) < 10_000


def test_a_dead_letter_larger_than_the_producer_allows_is_truncated(bootstrap, tmp_path):
    """Larger than the producer's message.max.bytes (1 MB by default): refused before it is sent."""
    huge = b'{"id": "' + b"x" * 1_200_000

    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist([
            {"topic": "src", "partition": 3, "offset": i, "timestamp_ms": 0, "key": None,
             "value": huge if i == 5 else json.dumps({"id": str(i)}).encode(), "headers": None}
            for i in range(rng.start, rng.end)], schema=RAW_SCHEMA)

    dlq = "dlq-unit-huge"
    outcome = process_range(spec(tmp_path, bootstrap, dlq, flush_records=5), Range("src", 3, 0, 10),
                            read).to_pylist()[0]
    assert (outcome["status"], outcome["committable"]) == ("ok", 10), outcome["error"]
    [letter] = dead_letter_records(bootstrap, dlq)
    named = dict(letter.headers())
    assert (named["sink.truncated"], named["sink.original.value.bytes"]) == (b"true", str(len(huge)).encode())
    assert letter.key() is None and huge.startswith(letter.value()) and len(letter.value()) < 1_000_000


def test_replay_leaves_truncated_dead_letters_out(bootstrap, capsys):
    dlq, orders = "dlq-unit-replay-cut", "replay-cut-orders"
    create_topics(bootstrap, {dlq: 1, orders: 1})
    producer = Producer({"bootstrap.servers": bootstrap})
    whole = dead_letter_headers(BadRecord(orders, 0, 1, "why", "invalid_json"), 0, HEADERS)
    cut = [*dead_letter_headers(BadRecord(orders, 0, 2, "why", "invalid_json"), 0, HEADERS),
           ("sink.truncated", b"true"), ("sink.original.value.bytes", b"50000")]
    producer.produce(dlq, key=b"k1", value=b"v1", headers=whole)
    producer.produce(dlq, key=b"k2", value=b"v2-cut", headers=cut)
    producer.flush(10)
    assert dead_letters.main(["replay", "--from", dlq], {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap}) == 0
    out = capsys.readouterr().out
    assert "replayed 1 record(s)" in out and "1 truncated dead letter(s) left out" in out, out
    assert [m.key() for m in dead_letter_records(bootstrap, orders)] == [b"k1"]


def test_an_unreachable_dead_letter_broker_is_waited_for_then_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(dead_letters, "DELIVERY_TIMEOUT_MS", 1500)
    outcome = process_range(spec(tmp_path, "127.0.0.1:1", "dlq"), Range("src", 3, 0, 300),
                            reader(300, {20})).to_pylist()[0]
    assert (outcome["status"], outcome["error_kind"], outcome["committable"]) == ("retryable", ERROR_DEAD_LETTER, 0)
    assert "offset=20" in outcome["error"]


def test_dlq_policy_needs_a_topic_outside_the_consumed_ones():
    assert config_problems(ems_env(SINK_ERROR_POLICY="dlq")) == [
        "SINK_DLQ_TOPIC is required when SINK_ERROR_POLICY=dlq."]
    assert "its bad records would come back" in config_problems(
        ems_env(SINK_ERROR_POLICY="dlq", SINK_DLQ_TOPIC="orders"))[0]
    assert "sends nothing there" in config_problems(ems_env(SINK_DLQ_TOPIC="orders-dlq"))[0]
    assert load_config(ems_env(SINK_ERROR_POLICY="dlq", SINK_DLQ_TOPIC="orders-dlq")).dlq_topic == "orders-dlq"


def test_replay_moves_dead_letters_back_once_per_filter(bootstrap, capsys):
    dlq, orders, users = "dlq-unit-replay", "replay-orders", "replay-users"
    create_topics(bootstrap, {dlq: 2, orders: 1, users: 1})
    producer = Producer({"bootstrap.servers": bootstrap})
    letters = [(orders, 0, "missing_key"), (orders, 1, "invalid_json"), (users, 0, "missing_key"),
               (orders, 2, "missing_key")]
    for i, (source, offset, kind) in enumerate(letters):
        headers = dead_letter_headers(BadRecord(source, 0, offset, "why", kind), 1_700_000_000_000, HEADERS)
        producer.produce(dlq, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=headers, partition=i % 2)
    producer.flush(10)
    env = {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_GROUP_ID": "svc"}

    def run(*args: str) -> str:
        assert dead_letters.main(["replay", "--from", dlq, *args], env) == 0
        return capsys.readouterr().out

    dry = run("--dry-run", "--reason", "missing_key")
    assert f"would replay 2 record(s) to topic={orders} reason=missing_key" in dry
    assert end_offset(bootstrap, orders) == 0, "a dry run produces nothing"
    assert "replayed 3 record(s)" in run("--reason", "missing_key")
    assert "replayed 0 record(s)" in run("--reason", "missing_key"), "a second run re-sends nothing"
    assert "replayed 1 record(s)" in run("--reason", "invalid_json"), "another filter keeps its own position"
    back = dead_letter_records(bootstrap, orders)
    assert sorted((m.key(), m.value()) for m in back) == [(b"k0", b"v0"), (b"k1", b"v1"), (b"k3", b"v3")]
    assert all(m.headers() == HEADERS for m in back), "the sink.* headers are dropped, the rest kept"
    assert [(m.key(), m.headers()) for m in dead_letter_records(bootstrap, users)] == [(b"k2", HEADERS)]


def test_replay_needs_a_bootstrap_and_an_existing_topic(bootstrap, capsys):
    assert dead_letters.main(["replay", "--from", "x"], {}) == 2
    assert dead_letters.main(["replay", "--from", "no-such-dlq"], {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap}) == 1
    assert "dead-letter topic no-such-dlq not found" in capsys.readouterr().err


def end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dlq-ends"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def test_the_spec_never_shows_the_client_secrets():
    spec = DeadLetterSpec.of("dlq", {"bootstrap.servers": "b:9092", "sasl.password": "hunter2"})
    assert "hunter2" not in repr(spec) and "hunter2" not in repr(TaskSpec(
        DecodeSpec(None, ("id",), "_offset"), None, build_target, "{topic}", "/tmp", 1, 1, "snappy", "dlq",
        dead_letters=spec))
