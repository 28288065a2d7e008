# ruff: noqa: F811  (the place/parquet fixtures are imported from test_uploader_delta)
"""Delta table maintenance (uploader.delta_maintenance) on real tables, on a directory and on moto's S3.

What must hold: compaction, checkpoints and log cleanup keep the application transactions (a replay of
an old file is still skipped), a maintenance that loses to a concurrent merge never fails an upload,
and vacuum never deletes a file a reader of a snapshot younger than the retention may still read.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

import uploader.delta_maintenance as maintenance
from tests.component.uploader.test_uploader_delta import (  # noqa: F401 (fixtures)
    SCHEMA,
    Place,
    merge_one,
    parquet,
    place,
    row,
    span,
)
from uploader.delta_maintenance import META_MAINTENANCE, maintain, retention_hours
from uploader.delta_settings import DeltaSettings

pytestmark = pytest.mark.usefixtures("aws_env")


def files_of(rows_per_file: int, files: int, partitions: int = 3, keys: int = 40) -> list[tuple[int, list[dict]]]:
    """(partition, rows) per file: keys updated over and over, offsets rising per partition."""
    out, next_offset = [], Counter()
    for n in range(files):
        partition = n % partitions
        rows = []
        for k in range(rows_per_file):
            offset = next_offset[partition]
            next_offset[partition] += 1
            rows.append(row((n * 7 + k) % keys + 1000 * partition, offset, f"v{n}", float(n)))
        out.append((partition, rows))
    return out


def expected_of(files: list[tuple[int, list[dict]]]) -> dict[int, dict]:
    latest: dict[int, dict] = {}
    for _, rows in files:
        for r in rows:
            if r["id"] not in latest or r["_offset"] > latest[r["id"]]["_offset"]:
                latest[r["id"]] = r
    return latest


def transactions(place: Place, partitions: int = 3) -> dict[int, int | None]:
    table = place.table()
    return {p: table.transaction_version(f"kafka-parquet-sink/g1/orders/{p}") for p in range(partitions)}


def test_compaction_on_a_version_multiple_keeps_rows_and_application_transactions(place: Place, parquet):
    target = place.target(compact_every_commits=10, vacuum_every_commits=0)
    files = files_of(rows_per_file=5, files=25)
    paths = [(parquet(rows), span(rows, p)) for p, rows in files]
    receipts = [merge_one(target, path, meta) for path, meta in paths]

    ran = [r["maintenance"] for r in receipts if "maintenance" in r]
    assert [m["at_version"] for m in ran] == [10, 20]  # version 0 is the create; merge n commits version n
    assert not any(m["failed"] for m in ran) and ran[0]["compact"]["numFilesRemoved"] > 1
    expected = expected_of(files)
    assert place.rows() == expected and place.rows_from_files() == expected
    assert transactions(place) == {p: max(r["_offset"] for q, rows in files if q == p for r in rows) + 1
                                   for p in range(3)}
    assert len(place.table().file_uris()) < 10  # 25 merges left ~30 files; compactions merged them
    # Exactly-once bookkeeping survived: every file replayed, by this and by a fresh target, is skipped.
    version = place.table().version()
    for path, meta in paths:
        assert merge_one(target, path, meta)["skipped"]
        assert merge_one(place.target(), path, meta)["skipped"]
    assert place.table().version() == version
    assert set(place.applications().values()) == {1} and len(place.applications()) == 25


def test_transactions_survive_compaction_checkpoint_and_log_cleanup(tmp_path, parquet):
    """Log entries older than the log retention are deleted after a checkpoint: the transactions then
    come from the checkpoint alone, and a replay of the first file is still skipped."""
    uri = str(tmp_path / "orders")
    DeltaTable.create(uri, SCHEMA, configuration={"delta.checkpointInterval": "5",
                                                  "delta.logRetentionDuration": "interval 0 seconds"})
    place = Place(uri, DeltaSettings(
        table_uri=uri, group_id="g1", compact_every_commits=0, vacuum_every_commits=0), None, None)
    target = place.target()
    files = files_of(rows_per_file=3, files=12)
    paths = [(parquet(rows), span(rows, p)) for p, rows in files]
    for path, meta in paths:
        merge_one(target, path, meta)
    before = transactions(place)

    table = place.table()
    report = maintain(table, place.target(compact_every_commits=1).settings, table.version())
    assert not report["failed"] and report["compact"]["numFilesRemoved"] > 1
    table = place.table()
    table.create_checkpoint()
    table.cleanup_metadata()

    log = sorted(os.listdir(tmp_path / "orders" / "_delta_log"))
    assert "00000000000000000000.json" not in log  # the early entries are gone
    assert any(name.endswith(".checkpoint.parquet") for name in log)
    assert transactions(place) == before
    for path, meta in paths[:3]:
        assert merge_one(place.target(), path, meta)["skipped"]
    assert place.rows() == expected_of(files)


def test_our_commits_write_checkpoints_every_checkpoint_interval_with_the_transactions(tmp_path, parquet):
    uri = str(tmp_path / "orders")
    DeltaTable.create(uri, SCHEMA, configuration={"delta.checkpointInterval": "4"})
    place = Place(uri, DeltaSettings(
        table_uri=uri, group_id="g1", compact_every_commits=0), None, None)
    target = place.target()
    for p, rows in files_of(rows_per_file=2, files=9):
        merge_one(target, parquet(rows), span(rows, p))
    log = tmp_path / "orders" / "_delta_log"
    checkpoints = sorted(name for name in os.listdir(log) if name.endswith(".checkpoint.parquet"))
    # Nine merges after the create: versions 0-9; a checkpoint after every fourth commit (versions 3, 7).
    assert checkpoints == ["00000000000000000003.checkpoint.parquet", "00000000000000000007.checkpoint.parquet"]
    last = pq.read_table(log / checkpoints[-1]).to_pylist()
    apps = {a["txn"]["appId"]: a["txn"]["version"] for a in last if a.get("txn")}
    assert set(apps) == {f"kafka-parquet-sink/g1/orders/{p}" for p in range(3)}
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 7


def test_a_compaction_that_loses_to_a_concurrent_merge_is_skipped_and_the_upload_succeeds(place, parquet,
                                                                                           monkeypatch):
    """Just before the compaction commits, another writer's merge rewrites a file it read: delta-rs
    refuses the compaction; the upload that ran it still succeeds, the report says so, nothing is lost."""
    target, rival = place.target(compact_every_commits=6, vacuum_every_commits=0), place.target()
    real = maintenance._compact

    def raced(table: DeltaTable, version: int) -> dict:
        table.update_incremental()
        theirs = [row(1, 500, "RIVAL", 5.0)]  # key 1 lives in an early file: that file is rewritten
        merge_one(rival, parquet(theirs), span(theirs, partition=7))
        return table.optimize.compact()  # from the snapshot before the rival's merge

    monkeypatch.setattr(maintenance, "_compact", raced)
    files = [(0, [row(k, k, "A")]) for k in range(1, 7)]
    receipts = [merge_one(target, parquet(rows), span(rows, p)) for p, rows in files]
    report = receipts[-1]["maintenance"]
    assert report["failed"] == ["compact"] and "concurrent transaction" in report["compact"]
    assert place.rows()[1] == row(1, 500, "RIVAL", 5.0) and set(place.rows()) == set(range(1, 7))

    monkeypatch.setattr(maintenance, "_compact", real)  # the next multiple compacts
    more = [(0, [row(k, k, "B")]) for k in range(7, 13)]
    receipts = [merge_one(target, parquet(rows), span(rows, p)) for p, rows in more]
    assert any(not r.get("maintenance", {"failed": ["x"]})["failed"] for r in receipts)
    assert place.rows()[1] == row(1, 500, "RIVAL", 5.0) and set(place.rows()) == set(range(1, 13))
    assert set(place.applications().values()) == {1} and len(place.applications()) == 13


def test_a_failing_maintenance_never_fails_the_upload(place, parquet, monkeypatch):
    def broken(table: DeltaTable, version: int) -> dict:
        raise CommitFailedError("Failed to commit transaction: simulated")

    monkeypatch.setattr(maintenance, "_compact", broken)
    target = place.target(compact_every_commits=1, vacuum_every_commits=0)
    receipt = merge_one(target, parquet([row(1, 0)]), span([row(1, 0)]))
    assert receipt["maintenance"]["failed"] == ["compact"]
    assert place.rows() == {1: row(1, 0)}


def test_vacuum_keeps_files_younger_than_the_retention(place, parquet):
    target = place.target(compact_every_commits=5, vacuum_every_commits=5)  # retention: the default 168 h
    for p, rows in files_of(rows_per_file=4, files=5):
        receipt = merge_one(target, parquet(rows), span(rows, p))
    report = receipt["maintenance"]
    assert report["vacuum"] == {"deleted_files": 0, "retention_hours": 168}  # compacted files: minutes old
    assert report["compact"]["numFilesRemoved"] > 1

    # With no retention (below the configuration's floor, where 0 means off; only callable here) they go.
    table = place.table()
    unsafe = place.target(vacuum_retention_hours=0).settings
    assert maintenance._vacuum(table, unsafe, table.version())["deleted_files"] > 1
    assert place.rows() == expected_of(files_of(rows_per_file=4, files=5))
    assert place.rows_from_files() == place.rows()
    if place.fs is None:
        assert any(META_MAINTENANCE in c for c in place.table().history())


def test_the_tables_own_deleted_file_retention_wins_when_longer(tmp_path):
    uri = str(tmp_path / "t")
    DeltaTable.create(uri, pa.schema([("id", pa.int64())]),
                      configuration={"delta.deletedFileRetentionDuration": "interval 30 days"})
    settings = DeltaSettings(table_uri=uri, group_id="g")
    assert retention_hours(DeltaTable(uri), settings) == 720
    other = str(tmp_path / "u")
    DeltaTable.create(other, pa.schema([("id", pa.int64())]))
    assert retention_hours(DeltaTable(other), settings) == 168
