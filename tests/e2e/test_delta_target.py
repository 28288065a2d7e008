"""SINK_TARGET=delta end to end: the service as a process, a Delta table on a directory and on moto's S3
server, keyed updates and deletes (tombstones), kill -9 mid-stream, starting over a table that already
holds the head of every partition (as a crash between the Delta commit and Kafka's commit leaves it): the
table's transactions win over Kafka's offsets. And two instances of one group writing one table while one
of them is killed and restarted, so partitions move between them.

The table is read back with deltalake and with pyarrow over its active files (from the log's add/remove
actions); its history is the proof of exactly once: every commit names the partition range it applied,
and per partition those ranges must tile 0..end with no overlap (zero duplicate applications), however
much Kafka replayed after the crash. See tests/e2e/delta_checks.py.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed, metric_total, scrape_metrics
from tests.e2e.delta_checks import (
    CONFLICT_RETRY,
    S3_CREDENTIALS,
    SKIPPED,
    DeltaLocation,
    assignments,
    check_change_log_table,
    check_table,
    count_in_logs,
    delete_env,
    produce_orders_with_deletes,
)
from uploader.delta import DeltaFile, DeltaTarget
from uploader.delta_settings import APP_ID_PREFIX, DeltaSettings
from uploader.delta_staging import STAGING_DIR
from uploader.target import FileMetadata

pytestmark = pytest.mark.e2e

PARTITIONS = 3
HEAD = 500  # offsets per partition in the table before the service starts


def _location(place: str, tmp_path: Path, request: pytest.FixtureRequest, unique) -> DeltaLocation:
    """Where the table lives: a directory, or a fresh bucket on moto's S3 server (credentials from aws_env)."""
    if place == "dir":
        return DeltaLocation(str(tmp_path / "lake" / "{topic}"))
    request.getfixturevalue("aws_env")
    moto_url = request.getfixturevalue("moto_url")
    bucket = unique("lake")
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    return DeltaLocation(f"s3://{bucket}/tables/{{topic}}", moto_url)


def _delta_env(service_env, topic: str, group: str, location: DeltaLocation, **overrides: object) -> dict[str, str]:
    env = service_env(topic, group, SINK_TARGET="delta", SINK_DELTA_TABLE_URI=location.uri, **overrides)
    env.pop("SINK_EMS_ENDPOINT")
    env.pop("SINK_EMS_AUTHORIZATION")
    if location.on_s3:
        env.update(SINK_S3_ENDPOINT_URL=location.endpoint_url, SINK_S3_REGION="us-east-1", **S3_CREDENTIALS)
    return env


@pytest.mark.parametrize(("place", "hard_deletes", "change_log"),
                         [("dir", True, False), ("s3", False, False), ("dir", True, True)],
                         ids=["dir-hard-deletes", "s3-soft-deletes", "dir-change-log-hard-deletes"])
def test_delta_table_is_exact_and_applied_once_through_kill_minus_nine(
        place, hard_deletes, change_log, bootstrap, tmp_path, unique, service_env, services, request):
    """With the change log (compacting at 1% of the table, so compactions run all along, the kill included),
    the head merged into the keyed table before is held there, and the view and the keyed table end exact."""
    started = time.monotonic()
    topic, group = unique("deltaorders"), unique("group")
    create_topics(bootstrap, {topic: PARTITIONS})
    workload = Workload()
    produce_orders_with_deletes(bootstrap, topic, keys=3000, updates=4, workload=workload)
    where = _location(place, tmp_path, request, unique)
    env = _delta_env(service_env, topic, group, where, SINK_FLUSH_RECORDS=1000, SINK_MAX_FILES_PER_BATCH=3,
                     SINK_MAX_BATCH_RECORDS=3000,
                     SINK_FLUSH_INTERVAL_MS=1000, **delete_env(hard_deletes),
                     **({"SINK_DELTA_CHANGE_LOG": "true", "SINK_DELTA_COMPACT_AT_CHANGES_PERCENT": "1"}
                        if change_log else {}))
    location = DeltaLocation(where.uri.replace("{topic}", topic), where.endpoint_url)
    total = sum(end_offsets(bootstrap, topic, PARTITIONS).values())

    def committed() -> int:
        return sum(committed_offsets(bootstrap, group, topic, PARTITIONS).values())

    _apply_head_by_hand(bootstrap, topic, group, location, tmp_path, HEAD, hard_deletes)

    crashed = service = services(env)
    wait_until(lambda: committed() > 0, 120, "progress before the crash", process=service)
    service.kill9()
    assert committed() < total, "the workload finished before the crash; make it larger"

    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS), 180, "all commits", process=service)
    assert service.terminate() == 0

    check = check_change_log_table if change_log else check_table
    found = check(location, workload, topic, group, end_offsets(bootstrap, topic, PARTITIONS),
                  hard_deletes=hard_deletes)
    logs = [crashed.log_path, service.log_path]
    if change_log:
        assert count_in_logs(logs, "compacted the change log") > 0, "the service compacted nothing"
    deleted = sum(1 for v in workload.expected_rows(topic).values() if v.get("_deleted"))
    print(f"delta e2e ({place}, hard deletes {hard_deletes}): {total} records, {deleted} keys ending deleted, "
          f"{found.applications} applications in {found.commits} commits ({found.cut} cut at the table's end), "
          f"duplicates {found.duplicates()}; files skipped as already applied: {count_in_logs(logs, SKIPPED)}, "
          f"conflicts retried: "
          f"{count_in_logs(logs, CONFLICT_RETRY)}; {time.monotonic() - started:.0f}s")


@pytest.mark.parametrize("change_log", [False, True], ids=["merge", "change-log"])
def test_two_instances_of_one_group_write_one_s3_table_exactly_once(
        change_log, bootstrap, tmp_path, unique, service_env, services, request):
    """Two instances of one group on one table while records flow. B joins once A is committing, so the
    rebalance moves two partitions from A, with A's batch in flight, to B; B is killed with kill -9 after its
    first commits and restarted (its Delta commits may be ahead of Kafka's). The two race on one log.

    (noida-db never hands a dead static member's partitions to the survivor, and a restarted instance is the
    same static member: so the move is made by B joining, not by the session timeout.)

    In change-log mode both append to one change log and both compact it (at 1% of the table, so all along)."""
    started = time.monotonic()
    partitions = 4
    topic, group = unique("deltatwo"), unique("group")
    create_topics(bootstrap, {topic: partitions})
    workload = Workload()
    produce_orders_with_deletes(bootstrap, topic, keys=2000, updates=4, workload=workload)

    def produce() -> None:  # live traffic, so both instances have work after the rebalance and the restart
        for burst in range(8):
            time.sleep(3)
            produce_orders_with_deletes(bootstrap, topic, keys=500, updates=4, workload=workload, seed=burst,
                                        key_prefix=f"live{burst}")

    where = _location("s3", tmp_path, request, unique)
    location = DeltaLocation(where.uri.replace("{topic}", topic), where.endpoint_url)
    envs = [_delta_env(service_env, topic, group, where, SINK_FLUSH_RECORDS=800, SINK_MAX_FILES_PER_BATCH=2,
                       SINK_MAX_BATCH_RECORDS=1600,
                       SINK_FLUSH_INTERVAL_MS=1000, **delete_env(False),
                       **({"SINK_DELTA_CHANGE_LOG": "true", "SINK_DELTA_COMPACT_AT_CHANGES_PERCENT": "1"}
                          if change_log else {})) for _ in range(2)]
    envs[1]["SINK_SCRATCH_DIR"] = str(tmp_path / "scratch-b")

    def committed() -> int:
        return sum(committed_offsets(bootstrap, group, topic, partitions).values())

    def batches(service) -> int:
        return service.output().count(" uploaded, committed ")

    producing = threading.Thread(target=produce)
    first = services(envs[0])
    wait_until(lambda: committed() > 0, 150, "the first instance's progress", process=first)
    producing.start()
    try:
        second = services(envs[1])
        wait_until(lambda: batches(second) > 0, 150, "the second instance's first commits", process=second)
        second.kill9()
        restarted = services(envs[1])
        producing.join()
        wait_until(lambda: all_committed(bootstrap, group, topic, partitions), 240, "all commits", process=first)
    finally:
        producing.join()
    samples = [scrape_metrics(int(env["SINK_HTTP_PORT"])) for env in envs]
    conflicts_metric = sum(metric_total(s, "sink_upload_retries_total", reason="delta_conflict") for s in samples)
    assert first.terminate() == 0
    assert restarted.terminate() == 0

    ends = end_offsets(bootstrap, topic, partitions)
    assert sum(ends.values()) == workload.produced
    check = check_change_log_table if change_log else check_table
    found = check(location, workload, topic, group, ends, hard_deletes=False)
    logs = [first.log_path, second.log_path, restarted.log_path]
    if change_log:
        assert count_in_logs(logs, "compacted the change log") > 0, "the instances compacted nothing"
    moved = {"a": assignments(first.log_path), "b": assignments(second.log_path),
             "b restarted": assignments(restarted.log_path)}
    assert moved["a"][0].startswith(f"{partitions} ") and moved["a"][-1].startswith("2 "), moved
    assert batches(first) and batches(restarted), "an instance never committed"
    print(f"two instances: {workload.produced} records, {found.applications} applications in {found.commits} "
          f"commits ({found.cut} cut at the table's end), duplicates {found.duplicates()}; conflicts retried: "
          f"{count_in_logs(logs, CONFLICT_RETRY)} in the logs ({conflicts_metric:.0f} on the live instances' "
          f"/metrics), files skipped as already applied: {count_in_logs(logs, SKIPPED)}; batches a/b/b again "
          f"{batches(first)}/{batches(second)}/{batches(restarted)}; assignments {moved}; "
          f"{time.monotonic() - started:.0f}s")


def test_kill_minus_nine_after_staging_before_the_merge_then_after_the_merge_loses_and_repeats_nothing(
        bootstrap, tmp_path, unique, service_env, services, request):
    """The two moments the driver's merge adds, hit on purpose on a directory table: kill -9 while a batch's
    files are staged but not merged (the table must not hold them: proved after the kill), then kill -9 as
    soon as a merge commit appears (the table may now be ahead of Kafka). The restarted service stages the
    ranges again; the table ends exact, every offset applied once, and no staged file is left behind."""
    started = time.monotonic()
    topic, group = unique("deltastage"), unique("group")
    create_topics(bootstrap, {topic: PARTITIONS})
    workload = Workload()
    produce_orders_with_deletes(bootstrap, topic, keys=3000, updates=4, workload=workload)
    where = _location("dir", tmp_path, request, unique)
    location = DeltaLocation(where.uri.replace("{topic}", topic), None)
    env = _delta_env(service_env, topic, group, where, SINK_FLUSH_RECORDS=700, SINK_MAX_FILES_PER_BATCH=2,
                     SINK_MAX_BATCH_RECORDS=1400,
                     SINK_FLUSH_INTERVAL_MS=1000, **delete_env(False))
    staging = Path(location.uri) / STAGING_DIR
    log_dir = Path(location.uri) / "_delta_log"

    def staged() -> list[Path]:
        return [p for p in staging.rglob("*.parquet") if not p.name.startswith(".")]

    def merges() -> int:
        return len(list(log_dir.glob("*.json"))) if log_dir.exists() else 0

    first = services(env)
    wait_until(lambda: staged(), 120, "a staged file", interval_s=0.01, process=first)
    first.kill9()
    in_window = [p for p in staged() if _not_applied(location, group, topic, p)]
    assert in_window, f"the kill came after the merge of {staged()}: no staged-but-unmerged file to prove"

    second = services(env)
    before = merges()
    wait_until(lambda: merges() > before, 120, "a merge commit", interval_s=0.01, process=second)
    second.kill9()
    table_ahead = {p: v for p, v in _transactions(location, group, topic).items()
                   if v > committed_offsets(bootstrap, group, topic, PARTITIONS).get(p, 0)}

    third = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS), 180, "all commits", process=third)
    assert third.terminate() == 0

    found = check_table(location, workload, topic, group, end_offsets(bootstrap, topic, PARTITIONS),
                        hard_deletes=False)
    assert staged() == [], f"staged files left behind: {staged()}"
    logs = [first.log_path, second.log_path, third.log_path]
    print(f"delta staging kills: {len(in_window)} staged file(s) unmerged at the first kill; partitions with the "
          f"table ahead of Kafka at the second: {table_ahead or 'none'}; {found.applications} applications in "
          f"{found.commits} commits, duplicates {found.duplicates()}; files skipped as already applied: "
          f"{count_in_logs(logs, SKIPPED)}; {time.monotonic() - started:.0f}s")


def _transactions(location: DeltaLocation, group: str, topic: str) -> dict[int, int]:
    try:
        table = location.deltalake()
    except TableNotFoundError:
        return {}
    found = {p: table.transaction_version(f"{APP_ID_PREFIX}/{group}/{topic}/{p}") for p in range(PARTITIONS)}
    return {p: v for p, v in found.items() if v is not None}


def _not_applied(location: DeltaLocation, group: str, topic: str, staged: Path) -> bool:
    """The staged file's range is not in the table (its name is `<first>-<last>.parquet` under its partition)."""
    partition, last = int(staged.parent.name), int(staged.stem.split("-")[1])
    return _transactions(location, group, topic).get(partition, 0) <= last


def _apply_head_by_hand(bootstrap: str, topic: str, group: str, location: DeltaLocation, tmp_path: Path,
                        count: int, hard_deletes: bool) -> None:
    """What a crash between the Delta commit and Kafka's commit leaves: the table holds each partition's
    first `count` offsets (applied with the group's transaction ids), Kafka has nothing committed."""
    target = DeltaTarget(DeltaSettings(table_uri=location.uri, group_id=group, hard_deletes=hard_deletes,
                                       endpoint_url=location.endpoint_url, region="us-east-1"))
    for partition in range(PARTITIONS):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-reader",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, partition, 0)])
        rows: list[dict] = []
        while len(rows) < count:
            message = consumer.poll(10)
            assert message is not None and message.error() is None
            value = json.loads(message.value()) if message.value() is not None else json.loads(message.key())
            rows.append({**value, "_offset": message.offset(), "_deleted": message.value() is None})
        consumer.close()
        path = tmp_path / f"head-{partition}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        target.merge([DeltaFile(path, FileMetadata(
            topic=topic, partition=partition, first_offset=0, last_offset=count - 1, record_count=count,
            target_table=topic, primary_keys=("id",), order_column="_offset", schema_fingerprint="by-hand"))])


def test_the_table_equals_each_keys_latest_record_field_by_field_through_the_service(
        bootstrap, tmp_path, unique, service_env, services):
    """Issue 37's phases, each committed before the next: a field new inside an object, soft deletes, one
    dirty value among clean ones, a field cleared. The dirty value costs its record (SINK_ERROR_POLICY=skip:
    said and counted), and the clean records after it merge as they are (a refused file once raised the
    topic's types, and every later file was refused too)."""
    topic, group = unique("exactrows"), unique("group")
    create_topics(bootstrap, {topic: 1})
    location = DeltaLocation(str(tmp_path / "lake" / "{topic}"))
    env = _delta_env(service_env, topic, group, location, SINK_FLUSH_INTERVAL_MS=500,
                     SINK_REJECTED_FILE_POLICY="park", SINK_PARKED_PATH=str(tmp_path / "parked"),
                     SINK_ERROR_POLICY="skip", **delete_env(False))
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    latest: dict[int, dict | None] = {}
    produced = 0

    def produce(records: list[tuple[int, dict | None]]) -> None:
        nonlocal produced
        for key, value in records:
            producer.produce(topic, key=json.dumps({"id": key}).encode(),
                             value=None if value is None else json.dumps({"id": key, **value}).encode(), partition=0)
            latest[key] = value
            produced += 1
        producer.flush(30)

    def committed() -> int:
        return committed_offsets(bootstrap, group, topic, 1).get(0, 0)

    service = services(env)
    phases = [
        [(k, {"amount": k, "coupon": f"c{k}", "customer": {"name": "n"}}) for k in range(100)],
        [(k, {"amount": k, "coupon": f"c{k}", "customer": {"name": "n2", "email": "e"}}) for k in range(50)],
        [(k, None) for k in range(50, 60)],
        [(60, {"amount": "n/a", "coupon": "c60", "customer": {"name": "dirty"}})],
        [(k, {"amount": k, "coupon": f"c{k}", "customer": {"name": "n3"}}) for k in range(61, 160)],
        [(0, {"amount": 1, "coupon": None, "customer": {"name": "n4"}})],
    ]
    dirty_offset = sum(len(p) for p in phases[:3])
    for phase in phases:
        produce(phase)
        wait_until(lambda: committed() == produced, 120, f"phase committed ({produced} records)", process=service)
    assert service.terminate() == 0

    assert not list((tmp_path / "parked").rglob("*.parquet")), "no file refused: the dirty record alone left out"
    said = [line for line in service.output().splitlines() if "bad record" in line and f"offset={dirty_offset}" in line]
    assert said and "column 'amount' holds 'n/a'" in said[0], service.output()[-3000:]
    latest[60] = phases[0][60][1]  # left out: the table keeps the key's earlier row
    table = DeltaTable(location.uri.replace("{topic}", topic)).to_pyarrow_table()
    assert pa.types.is_integer(table.schema.field("amount").type)
    rows = {r["id"]: r for r in table.to_pylist()}
    assert set(rows) == set(latest)
    for key, value in latest.items():
        row = rows[key]
        if value is None:
            assert row["_deleted"] and row["amount"] is None and row["customer"] is None and row["coupon"] is None, row
            continue
        assert not row["_deleted"], row
        assert row["amount"] == value["amount"] and row["coupon"] == value["coupon"], row
        assert {k: v for k, v in row["customer"].items() if v is not None} == value["customer"], row
