# ruff: noqa: F811  (the place/parquet fixtures are imported from test_uploader_delta)
"""Storage a Delta table's writers leave behind stays bounded (issue #37 item 9), on real tables on a
directory and on moto's S3 server.

- the data files of a merge that lost its commit race (what `max_commit_retries=0` leaves) are deleted by
  the vacuum once older than the retention; staged files and young files are not;
- a crashed widening's `.delta-widen-*` scratch directory is removed by maintenance and at a query's start;
- staged files S3 refuses to delete (DeleteObjects answers key by key) are logged at WARNING and counted;
- `check` fails a Delta table whose credentials may not delete, and says what to grant.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import CommitProperties
from deltalake.exceptions import CommitFailedError

import uploader.delta_maintenance as maintenance
from sink_service.check.probe import FAIL, OK
from sink_service.check.target_probes import delta_probe
from sink_service.driver.metrics import SinkMetrics
from tests.component.uploader.test_uploader_delta import (  # noqa: F401 (fixtures)
    FAST,
    Place,
    merge_one,
    parquet,
    place,
    row,
    span,
)
from uploader.delta_maintenance import maintain
from uploader.delta_settings import DeltaSettings
from uploader.delta_staging import (
    STAGING_DIR,
    WIDEN_LEFTOVER_AGE_S,
    WIDEN_SCRATCH_PREFIX,
    StagingArea,
    delete_failures,
)

pytestmark = pytest.mark.usefixtures("aws_env")

WEEK_AGO = time.time() - 200 * 3600  # older than the default retention (168 h)


def data_files(place: Place) -> set[str]:
    """Every Parquet file under the table outside its `_`-directories (log, staging), relative to it."""
    root = place.uri.replace("{topic}", "orders")
    if place.fs is None:
        return {str(p.relative_to(root)) for p in Path(root).rglob("*.parquet")
                if not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts)}
    prefix = root.removeprefix("s3://")
    found = place.fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
    return {i.path.removeprefix(prefix + "/") for i in found
            if i.path.endswith(".parquet") and not i.path.removeprefix(prefix + "/").startswith(("_", "."))}


def referenced(place: Place) -> set[str]:
    root = place.uri.replace("{topic}", "orders").rstrip("/") + "/"
    return {uri.removeprefix("file://").removeprefix(root) for uri in place.table().file_uris()}


def lose_a_commit_race(place: Place, parquet, key: int) -> None:
    """A merge from a snapshot another writer has moved past: delta-rs refuses its commit
    (`max_commit_retries=0`, as the target commits) after it wrote its data files. The rival inserts a
    new key, so no file is rewritten (a rewritten file is the log's to vacuum, not an orphan)."""
    stale = place.table()
    rows = [row(100 + key, 1000 + key, "RIVAL")]
    merge_one(place.target(), parquet(rows), span(rows, partition=9))
    with pytest.raises(CommitFailedError):
        stale.merge(pa.Table.from_pylist([row(key, 2000 + key, "LOST")]), predicate="t.id = s.id",
                    source_alias="s", target_alias="t", commit_properties=CommitProperties(max_commit_retries=0)
                    ).when_matched_update_all().when_not_matched_insert_all().execute()


def test_a_lost_merges_files_are_vacuumed_once_older_than_the_retention_and_nothing_else(tmp_path, parquet):
    uri = str(tmp_path / "tables" / "{topic}")
    place = Place(uri, DeltaSettings(table_uri=uri, group_id="g1", retry=FAST), None, None)
    target = place.target(compact_every_commits=0, vacuum_every_commits=0)
    for k in range(3):
        merge_one(target, parquet([row(k, k)]), span([row(k, k)]))
    lose_a_commit_race(place, parquet, key=1)
    root = tmp_path / "tables" / "orders"
    orphans = data_files(place) - referenced(place)
    assert len(orphans) == 1  # the lost merge's file: no commit references it
    for name in orphans:
        os.utime(root / name, (WEEK_AGO, WEEK_AGO))
    lose_a_commit_race(place, parquet, key=2)  # a second one, minutes old: within the retention
    young = data_files(place) - referenced(place) - orphans
    staged = root / STAGING_DIR / "g1" / "orders" / "0" / f"{0:020d}-{5:020d}.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes((tmp_path / "tables" / "orders" / next(iter(referenced(place)))).read_bytes())
    os.utime(staged, (WEEK_AGO, WEEK_AGO))
    before = data_files(place)

    table = place.table()
    report = maintain(table, place.target(vacuum_every_commits=1).settings, table.version())
    after = data_files(place)
    assert report["vacuum"] == {"deleted_files": 1, "retention_hours": 168}, report
    assert (len(before), len(after)) == (len(referenced(place)) + 2, len(referenced(place)) + 1)
    assert after == before - orphans and young <= after and staged.exists()
    assert place.rows() == place.rows_from_files() and place.rows()[101]["status"] == "RIVAL"
    assert place.rows()[1]["status"] == "NEW"


@pytest.mark.parametrize("place", ["s3"], indirect=True)
def test_a_lost_merges_files_are_vacuumed_on_s3(place, parquet):
    """On S3 (moto cannot age an object), with a retention of 0: only the full vacuum lists unreferenced files."""
    target = place.target(compact_every_commits=0, vacuum_every_commits=0)
    for k in range(3):
        merge_one(target, parquet([row(k, k)]), span([row(k, k)]))
    lose_a_commit_race(place, parquet, key=1)
    before = data_files(place)
    assert len(before - referenced(place)) == 1

    table = place.table()
    deleted = maintenance._vacuum(table, place.target(vacuum_retention_hours=0).settings, table.version())
    assert deleted["deleted_files"] == 1
    assert data_files(place) == referenced(place) and len(data_files(place)) == len(before) - 1
    assert place.rows() == place.rows_from_files()


def crashed_widening(partition_dir: Path, age_s: float) -> Path:
    """What a widening killed mid-way leaves: its tempfile scratch directory with the rows it converted."""
    partition_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=WIDEN_SCRATCH_PREFIX, dir=partition_dir))
    (scratch / "rows.parquet").write_bytes(b"PAR1" + b"\0" * 4096)
    then = time.time() - age_s
    for path in (scratch / "rows.parquet", scratch):
        os.utime(path, (then, then))
    return scratch


def test_a_crashed_widenings_scratch_is_removed_by_maintenance_and_at_a_querys_start(tmp_path, parquet):
    uri = str(tmp_path / "tables" / "{topic}")
    place = Place(uri, DeltaSettings(table_uri=uri, group_id="g1", retry=FAST), None, None)
    target = place.target(compact_every_commits=2, vacuum_every_commits=0)
    partition = tmp_path / "tables" / "orders" / STAGING_DIR / "g1" / "orders"
    old = crashed_widening(partition / "0", WIDEN_LEFTOVER_AGE_S + 60)
    live = crashed_widening(partition / "0", 60)  # a widening still running (or just killed): kept
    merge_one(target, parquet([row(1, 0)]), span([row(1, 0)]))
    receipt = merge_one(target, parquet([row(2, 1)]), span([row(2, 1)]))  # version 2: a compaction round

    assert receipt["maintenance"]["widen_leftovers"] == 1
    assert not old.exists() and live.exists()

    other = crashed_widening(partition / "3", WIDEN_LEFTOVER_AGE_S + 60)
    staged = (partition / "3" / f"{0:020d}-{4:020d}.parquet")
    staged.write_bytes(b"staged")
    area = StagingArea(place.settings, "orders")
    assert [s.location for s in area.listed("orders", 3)] == [str(staged)]  # the start's listing
    assert not other.exists() and staged.exists() and live.exists()


def deny_delete(s3, bucket: str, prefix: str) -> None:
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject",
         "Resource": f"arn:aws:s3:::{bucket}/{prefix}*"}]}))


def test_staged_files_s3_refuses_to_delete_are_logged_and_counted(moto_url, parquet, caplog):
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    bucket = f"staging-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    settings = DeltaSettings(table_uri=f"s3://{bucket}/lake/{{topic}}", group_id="g1", endpoint_url=moto_url,
                             region="us-east-1", retry=FAST)
    area = StagingArea(settings, "orders")
    rows = [[row(k, k)] for k in range(3)]
    for r in rows:
        area.stage(parquet(r), span(r))
    staged = [s.location for s in area.listed("orders", 0)]
    assert len(staged) == 3
    deny_delete(s3, bucket, f"lake/orders/{STAGING_DIR}/g1/orders/0/")
    metrics = SinkMetrics()
    counted = metrics.registry.get_sample_value("sink_delta_staging_delete_failures_total",
                                                {"reason": "AccessDenied"}) or 0
    before = delete_failures().get("AccessDenied", 0)

    with caplog.at_level(logging.WARNING, logger="uploader.delta_staging"):
        failed = area.delete(staged)
    assert sorted(failed) == sorted(staged) and all(r.startswith("AccessDenied") for r in failed.values())
    assert len(area.listed("orders", 0)) == 3
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "could not delete 3 staged file(s)" in warning.getMessage()
    assert "grant s3:DeleteObject" in warning.getMessage() and staged[0] in warning.getMessage()
    assert delete_failures()["AccessDenied"] == before + 3
    assert metrics.registry.get_sample_value("sink_delta_staging_delete_failures_total",
                                             {"reason": "AccessDenied"}) == counted + 3

    s3.delete_bucket_policy(Bucket=bucket)
    assert area.delete(staged) == {} and area.listed("orders", 0) == []
    area.close()


def test_check_fails_a_delta_table_whose_credentials_may_not_delete(moto_url):
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    bucket = f"check-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/lake/orders"
    settings = DeltaSettings(table_uri=uri, group_id="g1", endpoint_url=moto_url, region="us-east-1")
    assert delta_probe(settings, uri, 10.0).status == OK
    deny_delete(s3, bucket, "lake/orders/")

    probe = delta_probe(settings, uri, 10.0)
    assert probe.status == FAIL, probe
    assert "deleting s3://" in probe.reason and "AccessDenied" in probe.reason
    assert "grant s3:DeleteObject on the table's prefix" in probe.reason and "vacuum" in probe.reason
    assert probe.fix == "AWS credentials (AWS_ACCESS_KEY_ID/profile/role)"
