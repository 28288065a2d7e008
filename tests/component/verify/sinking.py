"""A topic with updates and deletes, and targets built from it by the real task code, without Spark,
with ways to damage them.

Per sunk partition p: versions 0 of keys k<p>-0..9 (offsets 0-9), versions 1 of them (10-19), a
tombstone of k<p>-3 (20) and new keys k<p>-10..14 (21-25). With SINK_FLUSH_RECORDS=10 the task
writes files 0-9, 10-19 and 20-25. Then 2 records past the committed offset (k<p>-0 version 2 and
k<p>-99), which `verify` must not count. Partition 2 holds records but is never committed.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Hashable
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from devkit.kafka_data import create_topics, reset_offsets
from local_ems.server import LocalEmsServer
from sink_service.config import SinkConfig, load_config, transform_for
from sink_service.config.decode_spec import decode_spec
from sink_service.config.upload_targets import build_target, target_settings
from sink_service.task import range_reader
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.range_reader import consumer_config, read_range
from sink_service.task.ranges import Range
from sink_service.verify.report import Report
from sink_service.verify.run import VerifyOptions, verify
from uploader.target import FileMetadata, Receipt, UploadTarget

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


def task_spec(config: SinkConfig, wrap: Callable[[UploadTarget], UploadTarget] | None = None) -> TaskSpec:
    """The spec a service's task gets from `config`, its target optionally wrapped."""

    def make_target(settings: Hashable) -> UploadTarget:
        target = build_target(settings)  # type: ignore[arg-type]
        return wrap(target) if wrap else target

    return TaskSpec(decode=decode_spec(config), target_settings=(target_settings(config), id(wrap)),
                    build_target=lambda s: make_target(s[0]), table_template=config.ems_target_table or "{topic}",
                    scratch_dir=config.scratch_dir, flush_bytes=config.flush_bytes,
                    flush_records=config.flush_records, compression=config.parquet_compression,
                    error_policy=config.error_policy, transform=transform_for(config))


def sink_range(config: SinkConfig, spec: TaskSpec, partition: int, start: int, end: int, topic: str = TOPIC) -> None:
    """Upload one partition's records `start` to `end` (exclusive) as a task does; nothing is committed."""
    client = consumer_config(config.kafka_client_config(), config.group_id)
    outcome = process_range(spec, Range(topic, partition, start, end),
                            lambda rng: read_range(rng, client, 1 << 26)).to_pylist()[0]
    assert outcome["status"] == "ok", outcome["error"]


def sink(config: SinkConfig, bootstrap: str,
         wrap: Callable[[UploadTarget], UploadTarget] | None = None) -> None:
    """Upload the sunk partitions' first COMMITTED records as the service's tasks do, then commit."""
    spec = task_spec(config, wrap)
    for p in SUNK:
        sink_range(config, spec, p, 0, COMMITTED)
    reset_offsets(bootstrap, config.group_id, {(TOPIC, p): COMMITTED for p in SUNK})


def close_consumers() -> None:
    """The range reader caches its consumers per process: closed so they do not outlive the broker."""
    for consumer in range_reader._consumers.values():
        consumer.close()
    range_reader._consumers.clear()


AUTH = "AppKey verify-secret"
ROOT = Path(__file__).resolve().parents[3]
LAST_FILE = f"{20:020d}-{25:020d}.parquet"
MIDDLE_FILE = f"{10:020d}-{19:020d}.parquet"


class Target:
    """One target of one kind, built by the task code, with ways to damage it."""

    def __init__(self, kind: str, env: dict[str, str], tmp: Path, ems: LocalEmsServer | None, s3: object):
        self.kind, self.env, self.tmp, self.ems, self.s3 = kind, env, tmp, ems, s3

    @property
    def config(self):
        return load_config(self.env)

    def file(self, partition: int, name: str) -> pa.Table:
        if self.kind == "dir":
            return pq.read_table(Path(self.env["SINK_DIR_PATH"]) / TOPIC / str(partition) / name)
        body = self.s3.get_object(Bucket=self.env["SINK_S3_BUCKET"], Key=f"p/{TOPIC}/{partition}/{name}")["Body"]
        return pq.read_table(pa.BufferReader(body.read()))

    def put(self, partition: int, name: str, table: pa.Table) -> None:
        if self.kind == "dir":
            pq.write_table(table, Path(self.env["SINK_DIR_PATH"]) / TOPIC / str(partition) / name)
            return
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        self.s3.put_object(Bucket=self.env["SINK_S3_BUCKET"], Key=f"p/{TOPIC}/{partition}/{name}",
                           Body=sink.getvalue().to_pybytes())

    def remove(self, partition: int, name: str) -> None:
        if self.kind == "dir":
            (Path(self.env["SINK_DIR_PATH"]) / TOPIC / str(partition) / name).unlink()
        else:
            self.s3.delete_object(Bucket=self.env["SINK_S3_BUCKET"], Key=f"p/{TOPIC}/{partition}/{name}")

    def delta(self):
        from deltalake import DeltaTable

        return DeltaTable(self.env["SINK_DELTA_TABLE_URI"])

    def sql(self, statement: str, *parameters: object) -> None:
        with sqlite3.connect(self.ems.data_dir / "ems.sqlite") as db:
            db.execute(statement, parameters)


class DropUpload:
    """A target that loses one upload: what a removed file is for an endpoint that applies files."""

    name = "drop"

    def __init__(self, inner: UploadTarget, partition: int, first_offset: int):
        self.inner, self.partition, self.first_offset = inner, partition, first_offset

    def upload(self, path, metadata: FileMetadata, on_retry=None) -> Receipt:
        if (metadata.partition, metadata.first_offset) == (self.partition, self.first_offset):
            return Receipt("ems", "dropped", None, 0, 1, 0.0)
        return self.inner.upload(path, metadata, on_retry)

    def close(self) -> None:
        self.inner.close()


def build(kind: str, bootstrap: str, tmp: Path, request: pytest.FixtureRequest, drop_last: bool = False) -> Target:
    group = f"verify-{kind}-{uuid.uuid4().hex[:8]}"
    ems, s3 = None, None
    if kind == "dir":
        settings = {"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp / "out")}
    elif kind == "s3":
        request.getfixturevalue("aws_env")
        url = request.getfixturevalue("moto_url")
        bucket = f"verify-{uuid.uuid4().hex[:8]}"
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        s3.create_bucket(Bucket=bucket)
        settings = {"SINK_TARGET": "s3", "SINK_S3_BUCKET": bucket, "SINK_S3_PREFIX": "p", "SINK_S3_ENDPOINT_URL": url,
                    "SINK_S3_REGION": "us-east-1"}
    elif kind == "delta":
        settings = {"SINK_TARGET": "delta", "SINK_DELTA_TABLE_URI": str(tmp / "table")}
    else:
        ems = LocalEmsServer(tmp / "ems", AUTH).start()
        request.addfinalizer(ems.stop)
        settings = {"SINK_TARGET": "ems", "SINK_EMS_ENDPOINT": ems.items_url(), "SINK_EMS_AUTHORIZATION": AUTH,
                    "SINK_EMS_TARGET_TABLE": "{topic}"}
    target = Target(kind, environment(bootstrap, group, tmp / "scratch", **settings), tmp, ems, s3)
    wrap = (lambda inner: DropUpload(inner, 0, 20)) if drop_last and kind in ("ems", "delta") else None
    sink(target.config, bootstrap, wrap)
    return target


def run_verify(target: Target, **options) -> Report:
    return verify(target.config, VerifyOptions(temp_dir=target.tmp, **options))
