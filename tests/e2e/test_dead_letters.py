"""SINK_ERROR_POLICY=dlq end to end: bad records leave for the dead-letter topic unchanged (one
larger than the topic takes, truncated and marked so), a dead-letter topic whose name the broker
refuses stops the service before the bad record (exit 3 naming SINK_DLQ_TOPIC, never skipped),
and the replay command brings the records back to land after a fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.kafka_data import committed_offsets, create_topics, end_offsets
from devkit.service_process import wait_until
from sink_service.task.dead_letters import original_headers
from tests.e2e.checks import all_committed, metric_total, scrape_metrics

pytestmark = pytest.mark.e2e

INVALID_TOPIC = "x" * 250  # longer than Kafka allows: the broker refuses every produce to it
HEADERS = [("trace", b"t-1"), ("none", None), ("bin", b"\xff\x00"), ("trace", b"t-2")]
DLQ_MAX_MESSAGE_BYTES = 10_000  # the source topic takes 1 MB: one bad record is too large for the DLQ
BIG = 120  # the offset of a 50 kB bad record


def records() -> list[tuple[bytes, bytes, list | None, str]]:
    """(key, value, headers, what) in offset order: good rows, invalid JSON, a value without `id`.

    Keys are JSON objects holding the id, so SINK_KEY_FORMAT=json is the fix for a missing `id`."""
    out: list[tuple[bytes, bytes, list | None, str]] = []
    for i in range(120):
        key = json.dumps({"id": f"r{i}"}).encode()
        if i in (30, 95):
            out.append((key, b'{"id": "r%d", "amount": ' % i, HEADERS, "invalid_json"))
        elif i in (50, 51, 110):
            out.append((key, json.dumps({"amount": i}).encode(), HEADERS, "missing_key"))
        else:
            out.append((key, json.dumps({"id": f"r{i}", "amount": i}).encode(), None, "good"))
    out.append((json.dumps({"id": f"r{BIG}"}).encode(), b'{"id": "' + b"z" * 50_000, HEADERS, "invalid_json"))
    return out


def read_all(bootstrap: str, topic: str) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-dlq-reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    while batch := consumer.consume(500, timeout=2):
        got += [m for m in batch if m.error() is None]
    consumer.close()
    return got


def replay(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "sink_service.dead_letters", "replay", *args],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dead_letters_wait_for_their_topic_then_replay_after_a_fix(bootstrap, ems, unique, service_env, services):
    topic, dlq, group = unique("dlq-source"), unique("dlq"), unique("group")
    create_topics(bootstrap, {topic: 1})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(dlq, 1, 1, config={"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)})])[dlq].result()
    produced = records()
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value, headers, _ in produced:
        producer.produce(topic, key=key, value=value, headers=headers, partition=0)
    producer.flush(10)
    good = {f"r{i}" for i, r in enumerate(produced) if r[3] == "good"}

    # 1. A dead-letter topic whose name the broker refuses: no replay can change that, so the service
    # stops before the bad record (exit 3), naming the setting to fix, instead of replaying forever.
    env = service_env(topic, group, SINK_ERROR_POLICY="dlq", SINK_DLQ_TOPIC=INVALID_TOPIC, SINK_FLUSH_RECORDS=20,
                      SINK_MAX_IDENTICAL_FAILURES=2, SINK_RESTART_BACKOFF_MAX_MS=1000)
    port = int(env["SINK_HTTP_PORT"])
    service = services(env)
    assert service.wait(120) == 3, service.output()[-3000:]
    stopped = [line for line in service.output().splitlines() if "stopping:" in line]
    assert stopped and "SINK_DLQ_TOPIC" in stopped[-1] and "valid topic name" in stopped[-1], stopped
    assert "offset=30" in stopped[-1], "names the bad record it could not dead-letter"
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 20}, "the file before the bad record is done"
    assert read_all(bootstrap, dlq) == []

    # 2. The topic fixed: every bad record is dead-lettered unchanged, everything committed.
    env["SINK_DLQ_TOPIC"] = dlq
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), 120, "commits to the end", process=service)
    assert {row["id"] for row in ems.table(topic)} == good
    letters = read_all(bootstrap, dlq)
    bad = {i: r for i, r in enumerate(produced) if r[3] != "good"}
    by_offset = {int(dict(m.headers())["sink.source.offset"]): m for m in letters}
    assert sorted(by_offset) == sorted(bad), "each bad record once (no replay happened here)"
    for offset, (key, value, headers, kind) in bad.items():
        m = by_offset[offset]
        named = dict(m.headers())
        if offset == BIG:  # cut to fit the topic, said so; still dead-lettered, nothing replayed forever
            assert (m.key(), original_headers(m.headers())) == (key, headers)
            assert value.startswith(m.value()) and len(m.value()) < DLQ_MAX_MESSAGE_BYTES
            assert named["sink.truncated"] == b"true" and named["sink.original.value.bytes"] == b"50008"
        else:
            assert (m.key(), m.value(), original_headers(m.headers())) == (key, value, headers)
            assert "sink.truncated" not in named
        assert (named["sink.error.kind"], named["sink.source.topic"]) == (kind.encode(), topic.encode())
        assert named["sink.source.partition"] == b"0" and named["sink.error.message"]
    samples = scrape_metrics(port)
    assert metric_total(samples, "sink_dead_letters_total", topic=topic, reason="invalid_json") == 3
    assert metric_total(samples, "sink_dead_letters_total", topic=topic, reason="missing_key") == 3
    assert service.terminate() == 0

    # 3. The fix (ids from the JSON key) and a replay of the records it fixes: they land.
    source_end = end_offsets(bootstrap, topic, 1)[0]
    assert "would replay 3 record(s)" in replay(env, "--from", dlq, "--reason", "missing_key", "--dry-run")
    assert end_offsets(bootstrap, topic, 1)[0] == source_end
    assert f"replayed 3 record(s) to topic={topic} reason=missing_key" in replay(
        env, "--from", dlq, "--reason", "missing_key")
    assert "replayed 0 record(s)" in replay(env, "--from", dlq, "--reason", "missing_key")
    assert end_offsets(bootstrap, topic, 1)[0] == source_end + 3
    env["SINK_KEY_FORMAT"] = "json"
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), 120, "the replayed records", process=service)
    assert {row["id"] for row in ems.table(topic)} == good | {"r50", "r51", "r110"}
    assert len(read_all(bootstrap, dlq)) == len(bad), "the replayed records were not dead-lettered again"
    assert service.terminate() == 0
