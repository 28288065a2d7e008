"""A topic with updates and deletes, and targets built from it by the real task code, without Spark.

Per sunk partition p: versions 0 of keys k<p>-0..9 (offsets 0-9), versions 1 of them (10-19), a
tombstone of k<p>-3 (20) and new keys k<p>-10..14 (21-25). With SINK_FLUSH_RECORDS=10 the task
writes files 0-9, 10-19 and 20-25. Then 2 records past the committed offset (k<p>-0 version 2 and
k<p>-99), which `verify` must not count. Partition 2 holds records but is never committed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from pathlib import Path

from confluent_kafka import Producer

from devkit.kafka_data import create_topics, reset_offsets
from sink_service.config import SinkConfig, transform_for
from sink_service.config.decode_spec import decode_spec
from sink_service.config.upload_targets import build_target, target_settings
from sink_service.task import range_reader
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.range_reader import consumer_config, read_range
from sink_service.task.ranges import Range
from uploader.target import UploadTarget

TOPIC = "verify-orders"
SUNK = (0, 1)
COMMITTED = 26  # per sunk partition
KEYS = 15  # per sunk partition
FLUSH_RECORDS = 10


def value(key: str, version: int) -> bytes:
    return json.dumps({"id": key, "version": version, "status": ["NEW", "PAID", "SHIPPED"][version],
                       "amount": 10.5 * version + len(key)}).encode()


def produce_topic(bootstrap: str) -> None:
    create_topics(bootstrap, {TOPIC: 3})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def send(partition: int, key: str, payload: bytes | None) -> None:
        producer.produce(TOPIC, key=key.encode(), value=payload, partition=partition)

    for p in SUNK:
        for version in (0, 1):
            for k in range(10):
                send(p, f"k{p}-{k}", value(f"k{p}-{k}", version))
        send(p, f"k{p}-3", None)
        for k in range(10, 15):
            send(p, f"k{p}-{k}", value(f"k{p}-{k}", 0))
        send(p, f"k{p}-0", value(f"k{p}-0", 2))  # past the committed offset
        send(p, f"k{p}-99", value(f"k{p}-99", 0))
    for k in range(3):
        send(2, f"k2-{k}", value(f"k2-{k}", 0))  # never committed
    producer.flush(30)


def environment(bootstrap: str, group: str, scratch: Path, **target: str) -> dict[str, str]:
    return {
        "SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": TOPIC, "SINK_GROUP_ID": group,
        "SINK_PRIMARY_KEYS": "_key", "SINK_TOMBSTONES": "soft-delete", "SINK_FLUSH_RECORDS": str(FLUSH_RECORDS),
        "SINK_SCRATCH_DIR": str(scratch), **target,
    }


def sink(config: SinkConfig, bootstrap: str,
         wrap: Callable[[UploadTarget], UploadTarget] | None = None) -> None:
    """Upload the sunk partitions' first COMMITTED records as the service's tasks do, then commit."""

    def make_target(settings: Hashable) -> UploadTarget:
        target = build_target(settings)  # type: ignore[arg-type]
        return wrap(target) if wrap else target

    spec = TaskSpec(decode=decode_spec(config), target_settings=(target_settings(config), id(wrap)),
                    build_target=lambda s: make_target(s[0]), table_template=config.ems_target_table or "{topic}",
                    scratch_dir=config.scratch_dir, flush_bytes=config.flush_bytes, flush_records=config.flush_records,
                    compression=config.parquet_compression, error_policy=config.error_policy,
                    transform=transform_for(config))
    client = consumer_config(config.kafka_client_config(), config.group_id)
    for p in SUNK:
        outcome = process_range(spec, Range(TOPIC, p, 0, COMMITTED),
                                lambda rng: read_range(rng, client, 1 << 26)).to_pylist()[0]
        assert outcome["status"] == "ok", outcome["error"]
    reset_offsets(bootstrap, config.group_id, {(TOPIC, p): COMMITTED for p in SUNK})


def close_consumers() -> None:
    """The range reader caches its consumers per process: closed so they do not outlive the broker."""
    for consumer in range_reader._consumers.values():
        consumer.close()
    range_reader._consumers.clear()
