"""Records already waiting in Kafka when the planner first looks at a partition, on a real broker.

A backlog whose partitions each hold less than a file used to wait SINK_FLUSH_INTERVAL_MS after a
start, however long ago it was written. The first look now dates pending records by their Kafka
timestamps; later records are dated by the looks, whatever their timestamps say.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from confluent_kafka import Producer

from devkit.kafka_data import create_topics
from sink_service.kafka_source.datasource import KafkaRangeStreamReader, SourceOptions

INTERVAL_MS = 60_000


def _produce(bootstrap: str, topic: str, partition: int, records: int, timestamp_ms: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(records):
        producer.produce(topic, key=f"k{i}".encode(), value=json.dumps({"id": i}).encode(),
                         partition=partition, timestamp=timestamp_ms)
    assert producer.flush(30) == 0


def _planner(bootstrap: str, tmp_path, topic: str, partitions: int) -> KafkaRangeStreamReader:
    options = SourceOptions(
        client_config={"bootstrap.servers": bootstrap}, group_id=f"{topic}-group",
        starting_positions={topic: {str(p): 0 for p in range(partitions)}}, flush_records=1000,
        flush_bytes=1 << 30, flush_interval_ms=INTERVAL_MS, max_files_per_batch=100,
        max_batch_records=800_000, executor_cores=100,
        retention_gap_policy="fail", read_batch_max_bytes=1 << 20, state_dir=str(tmp_path), task="",
    )
    return KafkaRangeStreamReader(options)


@pytest.fixture
def topic(bootstrap: str) -> str:
    name = f"backlog-dating-{time.monotonic_ns()}"
    create_topics(bootstrap, {name: 3})
    now_ms = int(time.time() * 1000)
    _produce(bootstrap, name, 0, 30, now_ms - 2 * INTERVAL_MS)  # written two intervals ago: due at once
    _produce(bootstrap, name, 1, 30, now_ms)  # written now: waits its interval
    return name


def test_a_backlog_written_an_interval_ago_is_due_at_the_first_look(bootstrap, tmp_path, topic):
    reader = _planner(bootstrap, tmp_path, topic, 3)
    end = reader.latestOffset(reader.initialOffset(), None)
    assert end == {topic: {"0": 30, "1": 0, "2": 0}}  # 30 records, far below a file of 1,000
    assert reader._admission.pending_since[(topic, 1)] > time.time() - 10  # dated by its record, written now


def test_records_with_old_timestamps_that_arrive_after_the_first_look_wait_their_interval(bootstrap, tmp_path,
                                                                                           topic):
    reader = _planner(bootstrap, tmp_path, topic, 3)
    end = reader.latestOffset(reader.initialOffset(), None)
    assert end[topic]["2"] == 0
    _produce(bootstrap, topic, 2, 30, int(time.time() * 1000) - 2 * INTERVAL_MS)  # event times, a mirror
    assert reader.latestOffset(end, None) == end  # partition 2 was looked at while empty: dated by the looks


def test_unreadable_timestamps_leave_the_records_dated_by_the_look(bootstrap, tmp_path, topic, monkeypatch, caplog):
    from confluent_kafka import KafkaError, KafkaException

    reader = _planner(bootstrap, tmp_path, topic, 3)
    kafka = reader._kafka()

    def refuse(*_args):
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer"))

    monkeypatch.setattr(kafka, "first_at_or_after", refuse)
    with caplog.at_level(logging.WARNING, logger="sink_service.kafka_source.datasource"):
        end = reader.latestOffset(reader.initialOffset(), None)
    assert end == {topic: {"0": 0, "1": 0, "2": 0}}
    assert "could not read the timestamps of 2 partition(s)" in caplog.text
