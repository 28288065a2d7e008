"""A new group started from a point in time in the middle of a topic: exactly the records from then arrive.

Records carry explicit timestamps one second apart, so `SINK_STARTING_OFFSETS=timestamp:<_BASE + 150 s>`
names offset 150 of each partition: the target must hold exactly those records and no older one.
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from devkit.kafka_data import committed_offsets, create_topics
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed, uploaded_ranges

pytestmark = pytest.mark.e2e

_BASE = 1_795_528_800_000  # 2026-11-24T14:00:00Z
RECORDS = 400  # per partition, _BASE + 0 s .. _BASE + 399 s


def test_a_group_started_from_a_time_in_the_middle_receives_exactly_the_records_from_then(
        bootstrap, ems, unique, service_env, services):
    topic, group = unique("from-time"), unique("group")
    create_topics(bootstrap, {topic: 2})
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in (0, 1):
        for i in range(RECORDS):
            value = {"id": f"{partition}-{i}", "version": 1, "amount": float(i)}
            producer.produce(topic, key=f"{partition}-{i}".encode(), value=json.dumps(value).encode(),
                             partition=partition, timestamp=_BASE + i * 1000)
    assert producer.flush(30) == 0

    service = services(service_env(topic, group, SINK_STARTING_OFFSETS="timestamp:2026-11-24T15:02:30+01:00",
                                   SINK_FLUSH_INTERVAL_MS=1000))  # 14:02:30Z = _BASE + 150 s
    wait_until(lambda: all_committed(bootstrap, group, topic, 2), 60, "the topic committed to its end",
               process=service)
    assert service.terminate() == 0

    ids = sorted(row["id"] for row in ems.table(topic))
    assert ids == sorted(f"{p}-{i}" for p in (0, 1) for i in range(150, RECORDS))  # 500 records, none older
    assert {p: min(first for first, _ in spans) for p, spans in uploaded_ranges(ems, topic).items()} == {0: 150, 1: 150}
    assert committed_offsets(bootstrap, group, topic, 2) == {0: RECORDS, 1: RECORDS}
    assert "the first record at or after 2026-11-24T14:02:30.000Z is offset 150" in service.output()
