"""Checks shared by the Delta target's end-to-end tests: a keyed workload with deletes, and the table read
back three ways that do not trust each other.

- `deltalake` itself (`DeltaTable.to_pyarrow_table()`);
- pyarrow over the table's active files, found by replaying the `add`/`remove` actions of `_delta_log/*.json`
  (read with plain file reads or boto3, not with deltalake's log reader);
- the commits' `commitInfo` in the same JSON files: every commit of the target names the partition range it
  applied, so applications per offset are counted from the table's history, not estimated.

On S3 the log is read with boto3 because delta-rs's `history()` hangs listing a moto log (see the component
tests); the JSON files are the history either way.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from confluent_kafka import Producer
from deltalake import DeltaTable

from devkit.kafka_data import Workload
from uploader.delta import applied_files
from uploader.delta_settings import APP_ID_PREFIX

FIELDS = ("version", "status", "amount", "customer", "note")
_VERSION_FILE = re.compile(r"(\d{20})\.json$")
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-key"}


# --- the workload ---------------------------------------------------------------------------------

def produce_orders_with_deletes(bootstrap: str, topic: str, *, keys: int, updates: int, workload: Workload,
                                seed: int = 7, key_prefix: str = "order", delete_share: float = 0.15) -> int:
    """`keys * updates` events with JSON keys `{"id": ...}` (SINK_KEY_FORMAT=json); after a key's first
    version, each event is a tombstone with probability `delete_share`, so keys are deleted, re-inserted
    and left deleted. `workload.latest` holds `{"id", "_deleted": True}` for a key whose last event deleted it."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": False})
    statuses = ("NEW", "PAID", "PACKED", "SHIPPED", "DELIVERED")
    count = 0
    for version in range(updates):
        for k in range(keys):
            key = f"{key_prefix}-{k}"
            key_bytes = json.dumps({"id": key}).encode()
            if version > 0 and rng.random() < delete_share:
                producer.produce(topic, key=key_bytes, value=None)
                workload.latest[(topic, key)] = {"id": key, "_deleted": True}
            else:
                value = {"id": key, "version": version, "status": statuses[version % len(statuses)],
                         "amount": round(rng.uniform(1, 500), 2), "customer": f"customer-{rng.randrange(1000)}",
                         "note": "x" * rng.randrange(0, 40)}
                producer.produce(topic, key=key_bytes, value=json.dumps(value).encode())
                workload.latest[(topic, key)] = value
            count += 1
            if count % 5000 == 0:
                producer.poll(0)
    producer.flush(30)
    workload.produced += count
    return count


def delete_env(hard_deletes: bool) -> dict[str, str]:
    """The service settings under which tombstones reach the table (soft, or hard on request)."""
    return {"SINK_KEY_FORMAT": "json", "SINK_PRIMARY_KEYS": "id", "SINK_TOMBSTONES": "soft-delete",
            "SINK_DELTA_HARD_DELETES": str(hard_deletes).lower()}


def assert_rows_exact(rows: list[dict], workload: Workload, topic: str, *, hard_deletes: bool, how: str) -> None:
    """The latest row per key: values of live keys, `_deleted` rows (soft) or no row (hard) for deleted ones."""
    expected = workload.expected_rows(topic)
    if hard_deletes:
        expected = {k: v for k, v in expected.items() if not v.get("_deleted")}
    got: dict[str, dict] = {}
    for row in rows:
        assert row["id"] not in got, f"{how}: key {row['id']} has two rows"
        got[row["id"]] = row
    lost, extra = expected.keys() - got.keys(), got.keys() - expected.keys()
    assert not lost and not extra, f"{how}: {len(lost)} keys lost (e.g. {sorted(lost)[:3]}), {len(extra)} " \
                                   f"keys that should not be there (e.g. {sorted(extra)[:3]})"
    for key, value in expected.items():
        row = got[key]
        if value.get("_deleted"):
            assert row.get("_deleted") is True, f"{how}: {key} should be soft-deleted: {row}"
            assert row.get("version") is None, f"{how}: {key} soft-deleted but holds a value: {row}"
            continue
        assert not row.get("_deleted"), f"{how}: {key} is marked deleted: {row}"
        for name in FIELDS:
            assert row[name] == value[name], f"{how}: {key}.{name}: {row[name]!r} != {value[name]!r}"


# --- the table, wherever it is --------------------------------------------------------------------

@dataclass
class DeltaLocation:
    """A Delta table on a directory or on an S3-compatible endpoint, read without the service's code."""

    uri: str  # a directory, or s3://bucket/path
    endpoint_url: str | None = None
    _s3: Any = field(default=None, repr=False)

    @property
    def on_s3(self) -> bool:
        return self.uri.startswith("s3://")

    def storage_options(self) -> dict[str, str] | None:
        if not self.on_s3:
            return None
        assert self.endpoint_url
        return {**S3_CREDENTIALS, "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint_url,
                "AWS_ALLOW_HTTP": "true"}

    def _bucket_and_prefix(self) -> tuple[str, str]:
        bucket, _, path = self.uri.removeprefix("s3://").partition("/")
        return bucket, path.rstrip("/")

    def s3(self) -> Any:
        if self._s3 is None:
            self._s3 = boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                                    aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                    aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        return self._s3

    def deltalake(self) -> DeltaTable:
        return DeltaTable(self.uri, storage_options=self.storage_options())

    def log(self) -> list[tuple[int, list[dict]]]:
        """Every commit file of `_delta_log`, in version order: (version, actions)."""
        entries: list[tuple[int, str]] = []
        if self.on_s3:
            bucket, prefix = self._bucket_and_prefix()
            pages = self.s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/_delta_log/")
            for page in pages:
                for obj in page.get("Contents", []):
                    match = _VERSION_FILE.search(obj["Key"])
                    if match:
                        body = self.s3().get_object(Bucket=bucket, Key=obj["Key"])["Body"].read().decode()
                        entries.append((int(match[1]), body))
        else:
            for path in (Path(self.uri) / "_delta_log").glob("*.json"):
                match = _VERSION_FILE.search(path.name)
                if match:
                    entries.append((int(match[1]), path.read_text()))
        entries.sort()
        versions = [v for v, _ in entries]
        assert versions == list(range(len(versions))), f"the log has gaps: {versions[:10]}..."
        return [(v, [json.loads(line) for line in text.splitlines() if line.strip()]) for v, text in entries]

    def active_files(self, log: list[tuple[int, list[dict]]]) -> list[str]:
        """The table's data files: every `add` not later `remove`d (relative, URL-encoded paths)."""
        active: dict[str, dict] = {}
        for _, actions in log:
            for action in actions:
                if "add" in action:
                    assert not action["add"].get("deletionVector"), "a deletion vector: read the files with it"
                    active[action["add"]["path"]] = action["add"]
                elif "remove" in action:
                    active.pop(action["remove"]["path"], None)
        return sorted(active)

    def rows_from_files(self, log: list[tuple[int, list[dict]]]) -> list[dict]:
        """The table read with pyarrow over its active files (no deltalake reader)."""
        parts = []
        if self.on_s3:
            bucket, prefix = self._bucket_and_prefix()
            host = urlsplit(self.endpoint_url)
            fs = pafs.S3FileSystem(access_key=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                   secret_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                                   endpoint_override=f"{host.hostname}:{host.port}", scheme="http")
            for path in self.active_files(log):
                parts.append(pq.read_table(f"{bucket}/{prefix}/{unquote(path)}", filesystem=fs))
        else:
            for path in self.active_files(log):
                parts.append(pq.read_table(Path(self.uri) / unquote(path)))
        if not parts:
            return []
        return pa.concat_tables(parts, promote_options="permissive").to_pylist()


# --- applications, from the history ---------------------------------------------------------------

@dataclass
class Applications:
    """What the table's commits applied, per partition, from their commitInfo and txn actions."""

    ranges: dict[int, list[tuple[int, int]]]  # partition -> [(applied_from, last)]
    files: list[str]  # the file name of every applying commit
    transactions: dict[int, int]  # partition -> the highest application-transaction version in the log
    commits: int  # all commits, including creation and any maintenance
    cut: int = 0  # applications of a file that overlapped the table's range, applied from the table's end on

    @property
    def applications(self) -> int:
        return len(self.files)

    def duplicates(self) -> int:
        """Offsets applied more than once, plus files applied more than once: 0 is exactly once."""
        twice = 0
        for spans in self.ranges.values():
            seen: set[int] = set()
            for first, last in spans:
                span = set(range(first, last + 1))
                twice += len(span & seen)
                seen |= span
        return twice + len(self.files) - len(set(self.files))


def applications(log: list[tuple[int, list[dict]]], group: str, topic: str) -> Applications:
    prefix = f"{APP_ID_PREFIX}/{group}/{topic}/"
    ranges: dict[int, list[tuple[int, int]]] = defaultdict(list)
    files: list[str] = []
    transactions: dict[int, int] = {}
    cut = 0
    for _, actions in log:
        for action in actions:
            for applied in applied_files(action.get("commitInfo", {})):
                if applied["app_id"].startswith(prefix):
                    partition = int(applied["app_id"].removeprefix(prefix))
                    ranges[partition].append((applied["applied_from"], applied["last_offset"]))
                    files.append(applied["file"])
                    cut += applied["applied_from"] != applied["first_offset"]
            txn = action.get("txn", {})
            if txn.get("appId", "").startswith(prefix):
                partition = int(txn["appId"].removeprefix(prefix))
                transactions[partition] = max(transactions.get(partition, 0), int(txn["version"]))
    return Applications(dict(ranges), files, transactions, len(log), cut)


def assert_applied_once(found: Applications, ends: dict[int, int]) -> None:
    """Per partition, the applied ranges tile 0..end with no overlap, and the transactions end there too."""
    for partition, end in ends.items():
        covered = 0
        for first, last in sorted(found.ranges.get(partition, [])):
            assert first == covered, f"partition {partition}: a commit applied from {first}, expected {covered} " \
                                     f"({'overlap: applied twice' if first < covered else 'gap: lost'})"
            covered = last + 1
        assert covered == end, f"partition {partition}: commits applied up to {covered}, the partition ends at {end}"
        assert found.transactions.get(partition) == end, \
            f"partition {partition}: application transaction {found.transactions.get(partition)}, expected {end}"
    assert found.duplicates() == 0
    assert len(found.files) == len(set(found.files)), "a file was applied twice"


def check_table(location: DeltaLocation, workload: Workload, topic: str, group: str, ends: dict[int, int], *,
                hard_deletes: bool) -> Applications:
    """The whole proof: deltalake's rows, pyarrow's rows over the active files, and exactly-once applications."""
    table = location.deltalake()
    assert_rows_exact(table.to_pyarrow_table().to_pylist(), workload, topic, hard_deletes=hard_deletes,
                      how="deltalake")
    log = location.log()
    assert_rows_exact(location.rows_from_files(log), workload, topic, hard_deletes=hard_deletes,
                      how="pyarrow over the active files")
    found = applications(log, group, topic)
    assert_applied_once(found, ends)
    for partition, end in ends.items():
        assert table.transaction_version(f"{APP_ID_PREFIX}/{group}/{topic}/{partition}") == end
    return found


def check_change_log_table(location: DeltaLocation, workload: Workload, topic: str, group: str,
                           ends: dict[int, int], *, hard_deletes: bool) -> Applications:
    """Change-log mode: what a reader sees through the view is exact, and every range was applied once across
    the keyed table's log (what was merged there before) and the change log's; then, after a last compaction,
    the keyed table alone is exact."""
    from uploader.delta_compaction import Compaction
    from uploader.delta_settings import DeltaSettings
    from uploader.delta_view import current_rows

    settings = DeltaSettings(table_uri=location.uri, group_id=group, hard_deletes=hard_deletes,
                             endpoint_url=location.endpoint_url, region="us-east-1", change_log=True)
    assert_rows_exact(current_rows(settings, topic, ("id",), "_offset").to_pylist(), workload, topic,
                      hard_deletes=hard_deletes, how="the view (keyed table + change log)")
    changes = DeltaLocation(settings.changes_uri_for(topic), location.endpoint_url)
    keyed_log, changes_log = location.log(), changes.log()
    found = applications(keyed_log + changes_log, group, topic)
    assert_applied_once(found, ends)
    Compaction(settings, Path(location.uri).parent / "compaction-scratch", keep_applied_s=0).compact(
        topic, ("id",), "_offset")
    assert_rows_exact(location.deltalake().to_pyarrow_table().to_pylist(), workload, topic,
                      hard_deletes=hard_deletes, how="the keyed table after a last compaction")
    return found


def change_log_pending_bytes(location: DeltaLocation, group: str, topic: str, scratch: Path) -> int:
    """Bytes of the change log's files holding changes no compaction has applied yet (0 without a change log)."""
    from uploader.delta_compaction import Compaction
    from uploader.delta_settings import DeltaSettings

    settings = DeltaSettings(table_uri=location.uri, group_id=group, endpoint_url=location.endpoint_url,
                             region="us-east-1", change_log=True)
    sizes = Compaction(settings, scratch).sizes(topic)
    return sizes.changes if sizes is not None else 0


def count_in_logs(paths: list[Path], text: str) -> int:
    """How often a line of the services' logs says `text` (e.g. a delta_conflict retry)."""
    return sum(p.read_text(errors="replace").count(text) for p in paths if p.exists())


def assignments(path: Path) -> list[str]:
    """The group assignments a service logged, in order (e.g. `2 partition(s) t:0, t:1`)."""
    marker = "group assignment: "
    return [line.split(marker, 1)[1].strip() for line in path.read_text(errors="replace").splitlines()
            if marker in line]


CONFLICT_RETRY = "failed (delta_conflict), retrying"
SKIPPED = "skipped: the table already holds"
