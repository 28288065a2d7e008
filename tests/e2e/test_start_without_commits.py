"""A group that starts without committed offsets, as Kafka's offsets.retention.minutes leaves one (issue #38).

Kafka deletes a group's offsets after it has had no member for the retention (7 days by default). A
Delta table still holds the group's exact position in its application transactions: the service resumes
there, and a retention gap below that position stops it (exit 3) as it does for a committed offset. On
every target the start without a committed offset is said at WARNING and counted in a metric.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders, reset_offsets
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed, metric_total, partitions_said_fresh, scrape_metrics
from tests.e2e.delta_checks import (
    SKIPPED,
    DeltaLocation,
    check_table,
    count_in_logs,
    delete_env,
    produce_orders_with_deletes,
)
from uploader.delta import DeltaFile, DeltaTarget
from uploader.delta_settings import DeltaSettings
from uploader.target import FileMetadata

pytestmark = pytest.mark.e2e

PARTITIONS = 2
HELD = 300  # offsets per partition the table holds for the group; Kafka holds no commit


def _table_holding(bootstrap: str, topic: str, group: str, uri: str, tmp_path: Path) -> None:
    """The table applied each partition's first HELD offsets under the group's transaction ids, and the
    group's committed offsets are gone: a group whose offsets expired."""
    target = DeltaTarget(DeltaSettings(table_uri=uri, group_id=group))
    for partition in range(PARTITIONS):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-reader",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, partition, 0)])
        rows: list[dict] = []
        while len(rows) < HELD:
            message = consumer.poll(10)
            assert message is not None and message.error() is None
            value = json.loads(message.value()) if message.value() is not None else json.loads(message.key())
            rows.append({**value, "_offset": message.offset(), "_deleted": message.value() is None})
        consumer.close()
        path = tmp_path / f"held-{partition}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        target.merge([DeltaFile(path, FileMetadata(
            topic=topic, partition=partition, first_offset=0, last_offset=HELD - 1, record_count=HELD,
            target_table=topic, primary_keys=("id",), order_column="_offset", schema_fingerprint="by-hand"))])
    assert [target.covered_to(topic, p) for p in range(PARTITIONS)] == [HELD] * PARTITIONS


def _delta_env(service_env, topic: str, group: str, uri: str, **overrides: object) -> dict[str, str]:
    env = service_env(topic, group, SINK_TARGET="delta", SINK_DELTA_TABLE_URI=uri, SINK_STARTING_OFFSETS="latest",
                      SINK_FLUSH_RECORDS=200, SINK_FLUSH_INTERVAL_MS=1000, **delete_env(False), **overrides)
    env.pop("SINK_EMS_ENDPOINT")
    env.pop("SINK_EMS_AUTHORIZATION")
    return env


def test_a_delta_group_whose_offsets_expired_resumes_exactly_at_the_tables_position(
        bootstrap, tmp_path, unique, service_env, services):
    topic, group = unique("expired-delta"), unique("group")
    create_topics(bootstrap, {topic: PARTITIONS})
    workload = Workload()
    produce_orders_with_deletes(bootstrap, topic, keys=600, updates=2, workload=workload)
    uri = str(tmp_path / "lake" / topic)
    _table_holding(bootstrap, topic, group, uri, tmp_path)
    env = _delta_env(service_env, topic, group, uri)
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS), 120, "all commits", process=service)
    samples = scrape_metrics(int(env["SINK_HTTP_PORT"]))
    assert service.terminate() == 0

    # SINK_STARTING_OFFSETS=latest did not apply: the table's position did, to the offset.
    assert re.search(rf"starting query at {{'{topic}:0': {HELD}, '{topic}:1': {HELD}}}", service.output()), \
        service.output()[-3000:]
    check_table(DeltaLocation(uri), workload, topic, group, end_offsets(bootstrap, topic, PARTITIONS),
                hard_deletes=False)
    assert count_in_logs([service.log_path], SKIPPED) == 0, "nothing below the table's position was read again"
    warnings = [line for line in service.output().splitlines() if " WARNING " in line
                and "no committed offset in consumer group" in line and "Delta table's position" in line]
    assert len(warnings) == 1 and f"partitions=0-{PARTITIONS - 1} ({PARTITIONS})" in warnings[0], warnings
    assert partitions_said_fresh(service.output(), topic) == PARTITIONS
    assert metric_total(samples, "sink_partitions_started_without_commit_total", topic=topic, start="table") \
        == PARTITIONS


def test_a_retention_gap_below_the_delta_tables_position_stops_the_start(
        bootstrap, tmp_path, unique, service_env, services):
    topic, group = unique("expired-delta-gap"), unique("group")
    create_topics(bootstrap, {topic: PARTITIONS})
    produce_orders_with_deletes(bootstrap, topic, keys=600, updates=2, workload=Workload())
    uri = str(tmp_path / "lake" / topic)
    _table_holding(bootstrap, topic, group, uri, tmp_path)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, HELD + 50)]).values():
        future.result(30)  # retention removed 50 records the table never got
    service = services(_delta_env(service_env, topic, group, uri))
    assert service.wait(120) == 3, service.output()[-3000:]
    errors = [line for line in service.output().splitlines() if " ERROR " in line and f"topic={topic} partition=0"
              in line]
    assert errors and f"Delta table's position (its application transaction for the group) {HELD}" in errors[0] \
        and f"the earliest available is {HELD + 50}" in errors[0], errors
    assert committed_offsets(bootstrap, group, topic, PARTITIONS) == {}, "nothing may be committed"


def test_an_ems_group_whose_offsets_expired_is_warned_and_counted(bootstrap, ems, unique, service_env, services):
    topic, group = unique("expired-ems"), unique("group")
    create_topics(bootstrap, {topic: 1})
    produce_orders(bootstrap, topic, keys=100, updates=1, workload=Workload(), key_prefix="old")
    reset_offsets(bootstrap, group, {(topic, 0): 100})  # the group ran, then had no member for 7 days
    produce_orders(bootstrap, topic, keys=50, updates=1, workload=Workload(), key_prefix="while-stopped")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_consumer_groups([group], request_timeout=30)[group].result(40)  # what offset expiry does
    env = service_env(topic, group, SINK_STARTING_OFFSETS="latest", SINK_FLUSH_INTERVAL_MS=1000)
    service = services(env)
    wait_until(lambda: committed_offsets(bootstrap, group, topic, 1) == {0: 150}, 120, "the start committed",
               process=service)
    samples = scrape_metrics(int(env["SINK_HTTP_PORT"]))
    assert service.terminate() == 0
    warned = [line for line in service.output().splitlines() if " WARNING " in line
              and f"topic={topic} partition=0: no committed offset in consumer group {group}" in line]
    assert len(warned) == 1, service.output()[-3000:]
    assert "offsets.retention.minutes" in warned[0] and "SINK_STARTING_OFFSETS=latest" in warned[0] \
        and "offset 150" in warned[0], warned
    assert metric_total(samples, "sink_partitions_started_without_commit_total", topic=topic,
                        start="first_start") == 1
