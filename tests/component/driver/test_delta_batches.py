"""The driver's Delta merge against real staged files and real tables, on a directory and on moto's S3:
what a batch applies, parks, deletes and leaves, without Spark (the rows are the tasks' outcome rows)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from sink_service.driver.delta_batches import DeltaBatches
from sink_service.driver.metrics import SinkMetrics
from uploader.delta import NARROWING, DeltaRefusal, applied_files
from uploader.delta_settings import DeltaSettings
from uploader.delta_staging import DeltaStagingSettings, DeltaStagingTarget
from uploader.directory import DirectorySettings
from uploader.retry import RetryPolicy
from uploader.target import FileMetadata

pytestmark = pytest.mark.usefixtures("aws_env")

FAST = RetryPolicy(max_elapsed_s=20.0, initial_backoff_s=0.01, max_backoff_s=0.2)
SCHEMA = pa.schema([("id", pa.int64()), ("status", pa.string()), ("_offset", pa.int64())])
TEXT = pa.schema([("id", pa.string()), ("status", pa.string()), ("_offset", pa.int64())])


@pytest.fixture(params=["dir", "s3"])
def settings(request, tmp_path) -> DeltaSettings:
    if request.param == "dir":
        return DeltaSettings(table_uri=str(tmp_path / "lake" / "{topic}"), group_id="g/1", retry=FAST)
    moto_url = request.getfixturevalue("moto_url")
    bucket = f"batches-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    return DeltaSettings(table_uri=f"s3://{bucket}/lake/{{topic}}", group_id="g/1", endpoint_url=moto_url,
                         region="us-east-1", retry=FAST)


class Batch:
    """Stages files as tasks do and builds their outcome rows."""

    def __init__(self, settings: DeltaSettings, tmp_path: Path) -> None:
        self.staging = DeltaStagingTarget(DeltaStagingSettings(settings))
        self.tmp_path = tmp_path
        self.rows: dict[int, list[dict]] = {}

    def stage(self, partition: int, first: int, ids: list, schema: pa.Schema = SCHEMA,
              row_group_rows: int | None = None) -> None:
        records = [{"id": k, "status": f"s{first + n}", "_offset": first + n} for n, k in enumerate(ids)]
        path = self.tmp_path / f"{uuid.uuid4().hex}.parquet"
        pq.write_table(pa.Table.from_pylist(records, schema=schema), path, row_group_size=row_group_rows)
        metadata = FileMetadata(topic="orders", partition=partition, first_offset=first,
                                last_offset=first + len(ids) - 1, record_count=len(ids), target_table="orders",
                                primary_keys=("id",), order_column="_offset", schema_fingerprint="x")
        receipt = self.staging.upload(path, metadata)
        self.rows.setdefault(partition, []).append({
            "parked": None, "location": receipt.location, "first_offset": first,
            "last_offset": metadata.last_offset, "records": len(ids), "bytes": receipt.bytes,
            "primary_keys": ["id"], "order_column": "_offset", "schema_fingerprint": "x"})

    def outcome_rows(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(topic="orders", partition=p, files=json.dumps(f)) for p, f in self.rows.items()]

    def staged(self, partition: int) -> list[int]:
        return [s.first_offset for s in self.staging.area("orders").listed("orders", partition)]


def _table(settings: DeltaSettings) -> DeltaTable:
    from uploader.delta_storage import storage_options

    return DeltaTable(settings.uri_for("orders"), storage_options=storage_options(settings) or None)


def _batches(settings: DeltaSettings, tmp_path: Path, metrics: SinkMetrics, park: bool,
             max_bytes: int = 1 << 20) -> DeltaBatches:
    parked = DirectorySettings(path=str(tmp_path / "parked")) if park else None
    return DeltaBatches(settings, parked, tmp_path / "scratch", max_bytes, metrics)


def test_a_batch_is_one_commit_its_staged_files_are_deleted_and_files_past_the_commit_wait(settings, tmp_path):
    batch = Batch(settings, tmp_path)
    batch.stage(0, 0, [1, 2])
    batch.stage(0, 2, [1, 3])
    batch.stage(1, 0, [4, 5])
    batch.stage(1, 2, [6])  # past partition 1's commit (its range failed after this file): must wait
    merger = _batches(settings, tmp_path, SinkMetrics(), park=False)

    merged = merger.apply(batch.outcome_rows(), {("orders", 0): 4, ("orders", 1): 2})
    merger.release(merged, {("orders", 0): 4, ("orders", 1): 2})

    table = _table(settings)
    assert table.version() == 1  # the create, then one merge for three files
    assert {r["id"]: r["status"] for r in table.to_pyarrow_table().to_pylist()} == {
        1: "s2", 2: "s1", 3: "s3", 4: "s0", 5: "s1"}
    assert table.transaction_version("kafka-parquet-sink/g/1/orders/0") == 4
    assert table.transaction_version("kafka-parquet-sink/g/1/orders/1") == 2
    assert batch.staged(0) == [] and batch.staged(1) == [2], "merged files deleted, the waiting one kept"

    # The replay stages partition 1 again from 2, cut differently; the query's start remembers the leftover.
    merger.start({("orders", 0): 4, ("orders", 1): 2}).join(60)
    replay = Batch(settings, tmp_path)
    replay.stage(1, 2, [6, 7])
    merged = merger.apply(replay.outcome_rows(), {("orders", 1): 4})
    merger.release(merged, {("orders", 1): 4})
    assert batch.staged(1) == [], "the crashed batch's leftover goes once the commit passes it"
    assert _table(settings).transaction_version("kafka-parquet-sink/g/1/orders/1") == 4


def test_a_refused_file_is_parked_and_the_rest_merged_or_under_fail_nothing_is(settings, tmp_path):
    batch = Batch(settings, tmp_path)
    batch.stage(0, 0, [1, 2])
    batch.stage(1, 0, [3])
    commits = {("orders", 0): 2, ("orders", 1): 1}
    _batches(settings, tmp_path, SinkMetrics(), park=False).apply(batch.outcome_rows(), commits)  # creates it
    later = Batch(settings, tmp_path)
    later.stage(0, 2, ["not-a-number"], TEXT)  # a text key for a long column: the table cannot take it
    later.stage(1, 1, [4])
    commits = {("orders", 0): 3, ("orders", 1): 2}
    version = _table(settings).version()

    with pytest.raises(DeltaRefusal) as refused:
        _batches(settings, tmp_path, SinkMetrics(), park=False).apply(later.outcome_rows(), commits)
    assert refused.value.reason == NARROWING and "partition 0, offsets 2-2" in str(refused.value)
    assert _table(settings).version() == version, "under fail nothing of the batch is applied"

    metrics = SinkMetrics()
    _batches(settings, tmp_path, metrics, park=True).apply(later.outcome_rows(), commits)
    table = _table(settings)
    assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == [1, 2, 3, 4]
    assert table.transaction_version("kafka-parquet-sink/g/1/orders/1") == 2
    parked = tmp_path / "parked" / "orders" / "0" / f"{2:020d}-{2:020d}.parquet"
    assert pq.read_table(parked).column("id").to_pylist() == ["not-a-number"]
    assert json.loads(Path(f"{parked}.response.json").read_text())["reason"] == NARROWING
    assert metrics.registry.get_sample_value("sink_parked_files_total",
                                             {"topic": "orders", "reason": NARROWING}) == 1
    applied = [f["file"] for c in table.history() for f in applied_files(c)] if not settings.on_s3() else None
    assert applied is None or not any("firstOffset-2_" in f and "partition-0" in f for f in applied)


def test_finding_the_refused_file_downloads_each_staged_file_once(settings, tmp_path, monkeypatch):
    """Parking one file and merging the rest, or splitting a merge delta-rs refused as a whole, reuses the
    group's downloads: each step once fetched every remaining file again."""
    batch = Batch(settings, tmp_path)
    batch.stage(0, 0, [1, 2])
    _batches(settings, tmp_path, SinkMetrics(), park=False).apply(batch.outcome_rows(), {("orders", 0): 2})
    later = Batch(settings, tmp_path)
    later.stage(0, 2, [3])
    later.stage(0, 3, ["not-a-number"], TEXT)
    later.stage(1, 0, [4])
    later.stage(1, 1, [5])
    merger = _batches(settings, tmp_path, SinkMetrics(), park=True)
    fetched: list[str] = []
    real_local = merger._local
    monkeypatch.setattr(merger, "_local", lambda upload: fetched.append(upload.location) or real_local(upload))
    real_merge = merger.target.merge
    whole: list[int] = []

    def refuse_the_first_group_as_a_whole(files, on_retry=None, on_bad_values=None):
        if not whole:  # as delta-rs does when its own cast fails on the merged source
            whole.append(len(files))
            raise DeltaRefusal([f.metadata for f in files], "table", "Cast error: made up")
        return real_merge(files, on_retry, on_bad_values=on_bad_values)
    monkeypatch.setattr(merger.target, "merge", refuse_the_first_group_as_a_whole)

    merger.apply(later.outcome_rows(), {("orders", 0): 4, ("orders", 1): 2})

    assert whole == [4]
    assert sorted(fetched) == sorted(f["location"] for files in later.rows.values() for f in files)
    assert sorted(r["id"] for r in _table(settings).to_pyarrow_table().to_pylist()) == [1, 2, 3, 4, 5]


def test_a_staged_file_past_the_memory_bound_is_merged_in_pieces_each_recording_its_prefix(settings, tmp_path):
    batch = Batch(settings, tmp_path)
    batch.stage(0, 0, [1, 2, 3, 4, 5, 6], row_group_rows=2)
    batch.stage(1, 0, [7])
    merger = _batches(settings, tmp_path, SinkMetrics(), park=False, max_bytes=1)
    merged = merger.apply(batch.outcome_rows(), {("orders", 0): 6, ("orders", 1): 1})
    merger.release(merged, {("orders", 0): 6, ("orders", 1): 1})

    table = _table(settings)
    assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == [1, 2, 3, 4, 5, 6, 7]
    assert table.version() == 4, "the create, then four merges: each piece, and partition 1's file, alone"
    assert table.transaction_version("kafka-parquet-sink/g/1/orders/0") == 6
    assert batch.staged(0) == [] and batch.staged(1) == []
