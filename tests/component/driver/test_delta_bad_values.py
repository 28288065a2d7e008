"""A value the Delta table's column cannot take costs its record, under SINK_ERROR_POLICY, in the driver's
merge: real records in a real broker, a real table, the dead-letter topic read back."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable

from devkit.kafka_data import create_topics
from sink_service.driver.delta_bad_values import KIND, DeltaBadValues
from sink_service.driver.delta_batches import DeltaBatches, StagedUpload
from sink_service.driver.metrics import SinkMetrics
from sink_service.task.dead_letters import DeadLetterSpec
from sink_service.task.parquet_files import ClosedFile, PartitionFileWriter
from sink_service.task.range_reader import consumer_config
from uploader.delta import DeltaTarget
from uploader.delta_settings import DeltaSettings
from uploader.delta_staging import DeltaStagingSettings, DeltaStagingTarget
from uploader.errors import FatalUploadError
from uploader.retry import RetryPolicy
from uploader.target import FileMetadata

FAST = RetryPolicy(max_elapsed_s=20.0, initial_backoff_s=0.01, max_backoff_s=0.2)
AMOUNTS = [1, 2, "n/a", 4]  # at offsets 1..4: offset 3 is dirty


def _setup(bootstrap: str, tmp_path: Path) -> tuple[str, DeltaSettings, list]:
    """A topic holding the records, a table that knows `amount` as a long, and the batch's staged file."""
    topic = f"badvalues-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {topic: 1})
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=b'{"id": 9}', value=b'{"id": 9, "amount": 9}', partition=0)  # offset 0
    for n, amount in enumerate(AMOUNTS):  # offsets 1..4
        producer.produce(topic, key=json.dumps({"id": n}).encode(), value=json.dumps({"id": n, "amount": amount}),
                         partition=0)
    producer.flush(30)
    settings = DeltaSettings(table_uri=str(tmp_path / "lake"), group_id="g", retry=FAST)
    first = _write(tmp_path / "first", topic, [{"id": 9, "amount": 9, "_offset": 0}])
    DeltaTarget(settings).merge([first[0]])  # the table: amount is a long; offsets 0.. are re-applied below
    closed: list[ClosedFile] = []
    writer = PartitionFileWriter(tmp_path / "files", topic, 0, max_bytes=1 << 30, max_records=1 << 30,
                                 compression="zstd", on_close=closed.append, typed_table=True)
    for n, amount in enumerate(AMOUNTS):  # as the task decodes them: text joins the numbers in one file
        writer.append(pa.Table.from_pylist([{"id": n, "amount": amount, "_offset": n + 1}]))
    writer.finish()
    staging = DeltaStagingTarget(DeltaStagingSettings(settings))
    c = closed[0]
    metadata = FileMetadata(topic=topic, partition=0, first_offset=1, last_offset=4, record_count=4,
                            target_table="", primary_keys=("id",), order_column="_offset",
                            schema_fingerprint=c.schema_fingerprint)
    receipt = staging.upload(c.path, metadata)
    return topic, settings, [StagedUpload(receipt.location, metadata, receipt.bytes, c.decoded_bytes)]


def _write(directory: Path, topic: str, rows: list[dict]):
    from uploader.delta import DeltaFile
    directory.mkdir(parents=True)
    path = directory / "f.parquet"
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows), path)
    return [DeltaFile(path, FileMetadata(topic=topic, partition=0, first_offset=0, last_offset=0, record_count=1,
                                         target_table="", primary_keys=("id",), order_column="_offset",
                                         schema_fingerprint="x"))]


def _rows(settings: DeltaSettings) -> dict[int, int | None]:
    return {r["id"]: r["amount"] for r in DeltaTable(settings.table_uri).to_pyarrow_table().to_pylist()}


def _outcome(staged: list[StagedUpload]):
    from types import SimpleNamespace
    s = staged[0]
    files = [{"parked": None, "location": s.location, "first_offset": 1, "last_offset": 4, "records": 4,
              "bytes": s.bytes, "decoded_bytes": s.decoded_bytes, "primary_keys": ["id"], "order_column": "_offset",
              "schema_fingerprint": s.metadata.schema_fingerprint}]
    return [SimpleNamespace(topic=s.metadata.topic, partition=0, files=json.dumps(files))]


def test_skip_leaves_the_dirty_record_out_says_it_and_merges_the_rest(bootstrap, tmp_path):
    topic, settings, staged = _setup(bootstrap, tmp_path)
    metrics = SinkMetrics()
    batches = DeltaBatches(settings, None, tmp_path / "scratch", 1 << 25, metrics, DeltaBadValues("skip", metrics))
    batches.apply(_outcome(staged), {(topic, 0): 5})
    assert _rows(settings) == {0: 1, 1: 2, 3: 4, 9: 9}
    assert metrics.registry.get_sample_value("sink_bad_records_total", {"topic": topic, "reason": KIND}) == 1
    assert DeltaTable(settings.table_uri).transaction_version(f"kafka-parquet-sink/g/{topic}/0") == 5


def test_fail_stops_the_merge_naming_the_record(bootstrap, tmp_path):
    topic, settings, staged = _setup(bootstrap, tmp_path)
    metrics = SinkMetrics()
    version = DeltaTable(settings.table_uri).version()
    batches = DeltaBatches(settings, None, tmp_path / "scratch", 1 << 25, metrics, DeltaBadValues("fail", metrics))
    with pytest.raises(FatalUploadError) as failed:
        batches.apply(_outcome(staged), {(topic, 0): 5})
    assert f"topic={topic} partition=0 offset=3: column 'amount' holds 'n/a'" in str(failed.value)
    assert failed.value.setting == "SINK_ERROR_POLICY"
    assert DeltaTable(settings.table_uri).version() == version, "nothing of the batch applied"


def test_dlq_sends_the_original_record_before_the_merge_commits(bootstrap, tmp_path):
    topic, settings, staged = _setup(bootstrap, tmp_path)
    dlq = f"{topic}-dlq"
    create_topics(bootstrap, {dlq: 1})
    metrics = SinkMetrics()
    client = {"bootstrap.servers": bootstrap}
    bad_values = DeltaBadValues("dlq", metrics, DeadLetterSpec.of(dlq, client), consumer_config(client, "g"))
    DeltaBatches(settings, None, tmp_path / "scratch", 1 << 25, metrics, bad_values).apply(
        _outcome(staged), {(topic, 0): 5})
    assert _rows(settings) == {0: 1, 1: 2, 3: 4, 9: 9}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dlq-reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(dlq, 0, 0)])
    letters = [m for m in consumer.consume(10, timeout=5) if m.error() is None]
    consumer.close()
    assert len(letters) == 1
    assert json.loads(letters[0].value()) == {"id": 2, "amount": "n/a"}
    headers = dict(letters[0].headers())
    assert headers["sink.error.kind"] == KIND.encode() and headers["sink.source.offset"] == b"3"
