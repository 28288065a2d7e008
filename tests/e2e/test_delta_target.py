"""SINK_TARGET=delta end to end: the service as a process, a Delta table on a directory, kill -9 mid-stream,
starting over a table that already holds the head of every partition (as a crash between the Delta
commit and Kafka's commit leaves it): the table's transactions win over Kafka's offsets.

The table is read back with deltalake, and its history is the proof of exactly once: every commit
names the partition range it applied, and per partition those ranges must tile 0..end with no overlap
(zero duplicate applications), however much Kafka replayed after the crash.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed
from uploader.delta import META_APP_ID, META_APPLIED_FROM, META_FILE, META_FIRST, META_LAST, DeltaTarget
from uploader.delta_settings import DeltaSettings
from uploader.target import FileMetadata

pytestmark = pytest.mark.e2e

PARTITIONS = 3
HEAD = 500  # offsets per partition in the table before the service starts


def test_delta_table_is_exact_and_applied_once_through_kill_minus_nine(
        bootstrap, tmp_path, unique, service_env, services):
    topic, group = unique("deltaorders"), unique("group")
    create_topics(bootstrap, {topic: PARTITIONS})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=3000, updates=4, workload=workload)
    lake = tmp_path / "lake"
    env = service_env(topic, group, SINK_TARGET="delta", SINK_DELTA_TABLE_URI=str(lake / "{topic}"),
                      SINK_FLUSH_RECORDS=1000, SINK_MAX_FILES_PER_BATCH=3)
    env.pop("SINK_EMS_ENDPOINT")
    env.pop("SINK_EMS_AUTHORIZATION")
    total = sum(end_offsets(bootstrap, topic, PARTITIONS).values())

    def committed() -> int:
        return sum(committed_offsets(bootstrap, group, topic, PARTITIONS).values())

    _apply_head_by_hand(bootstrap, topic, group, str(lake / topic), tmp_path, HEAD)

    crashed = service = services(env)
    wait_until(lambda: committed() > 0, 120, "progress before the crash", process=service)
    service.kill9()
    assert committed() < total, "the workload finished before the crash; make it larger"

    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS), 180, "all commits", process=service)
    assert service.terminate() == 0

    table = DeltaTable(str(lake / topic))
    rows = {r["id"]: r for r in table.to_pyarrow_table().to_pylist()}
    expected = workload.expected_rows(topic)
    assert len(rows) == len(expected) == table.to_pyarrow_table().num_rows
    for key, value in expected.items():
        for field in ("version", "status", "amount", "customer", "note"):
            assert rows[key][field] == value[field], f"{key}.{field}: {rows[key][field]!r} != {value[field]!r}"

    applied: dict[int, list[tuple[int, int]]] = defaultdict(list)
    files = []
    cut = 0  # commits of a file that overlapped the table's range, applied from the table's end on
    for commit in table.history():
        if META_APP_ID in commit:
            cut += commit[META_APPLIED_FROM] != commit[META_FIRST]
            partition = int(commit[META_APP_ID].rsplit("/", 1)[1])
            applied[partition].append((int(commit[META_APPLIED_FROM]), int(commit[META_LAST])))
            files.append(commit[META_FILE])
    ends = end_offsets(bootstrap, topic, PARTITIONS)
    for partition in range(PARTITIONS):
        covered = 0
        for first, last in sorted(applied[partition]):
            assert first == covered, f"partition {partition}: a commit applied from {first}, expected {covered}"
            covered = last + 1
        assert covered == ends[partition]
        assert table.transaction_version(f"kafka-parquet-sink/{group}/{topic}/{partition}") == ends[partition]
    assert len(files) == len(set(files)), "a file was applied twice"
    skipped = sum(s.log_path.read_text().count("skipped: the table already holds") for s in (crashed, service))
    print(f"delta e2e: {total} records, {len(files)} applications, each file once; files skipped as already "
          f"applied: {skipped}, applied from the table's end on: {cut}")



def _apply_head_by_hand(bootstrap: str, topic: str, group: str, uri: str, tmp_path: Path, count: int) -> None:
    """What a crash between the Delta commit and Kafka's commit leaves: the table holds each partition's
    first `count` offsets (applied with the group's transaction ids), Kafka has nothing committed."""
    target = DeltaTarget(DeltaSettings(table_uri=uri, group_id=group))
    for partition in range(PARTITIONS):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-reader",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, partition, 0)])
        rows: list[dict] = []
        while len(rows) < count:
            message = consumer.poll(10)
            assert message is not None and message.error() is None
            rows.append({**json.loads(message.value()), "_offset": message.offset()})
        consumer.close()
        path = tmp_path / f"head-{partition}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        target.upload(path, FileMetadata(topic=topic, partition=partition, first_offset=0, last_offset=count - 1,
                                         record_count=count, target_table=topic, primary_keys=("id",),
                                         order_column="_offset", schema_fingerprint="by-hand"))
