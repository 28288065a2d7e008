"""DeltaTarget against real Delta tables (delta-rs) on a local directory and on moto's S3 server.

Every table is read back two ways: with deltalake itself, and with pyarrow over the table's active
Parquet files. Applications are counted from the commits' infos (the files each commit applied).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from sink_service.config import ConfigError, load_config
from sink_service.config.upload_targets import build_target, target_settings
from tests.support.uploader_fixtures import metadata_builder
from uploader.delta import CONFLICT, META_WIDENED, NARROWING, DeltaFile, DeltaRefusal, DeltaTarget, applied_files
from uploader.delta_settings import DeltaSettings
from uploader.directory import DirectorySettings
from uploader.errors import FatalUploadError
from uploader.parking import PARKED_TARGET, ParkingTarget
from uploader.retry import RetryPolicy
from uploader.target import FileMetadata

pytestmark = pytest.mark.usefixtures("aws_env")

FAST = RetryPolicy(max_elapsed_s=30.0, initial_backoff_s=0.01, max_backoff_s=0.2)
metadata = metadata_builder(topic="orders", partition=0, primary_keys=("id",), order_column="_offset")
SCHEMA = pa.schema([("id", pa.int64()), ("status", pa.string()), ("amount", pa.float64()),
                    ("_offset", pa.int64()), ("_deleted", pa.bool_())])


class Place:
    """Where a test's table lives, and how to read it back independently of the target."""

    def __init__(self, uri: str, settings: DeltaSettings, storage: dict[str, str] | None,
                 fs: pafs.FileSystem | None) -> None:
        self.uri, self.settings, self.storage, self.fs = uri, settings, storage, fs

    def target(self, **changes: object) -> DeltaTarget:
        settings = self.settings if not changes else DeltaSettings(**{**self.settings.__dict__, **changes})
        return DeltaTarget(settings)

    def table(self) -> DeltaTable:
        return DeltaTable(self.uri.replace("{topic}", "orders"), storage_options=self.storage)

    def rows(self) -> dict[int, dict]:
        """The latest state read with deltalake, by key."""
        return {r["id"]: r for r in self.table().to_pyarrow_table().to_pylist()}

    def rows_from_files(self) -> dict[int, dict]:
        """The same state read with pyarrow over the table's active files, without deltalake's reader."""
        parts = []
        for uri in self.table().file_uris():
            if self.fs is None:
                parts.append(pq.read_table(uri))
            else:
                parts.append(pq.read_table(uri.removeprefix("s3://"), filesystem=self.fs))
        table = pa.concat_tables(parts, promote_options="permissive")
        return {r["id"]: r for r in table.to_pylist()}

    def commit_infos(self) -> list[dict]:
        """Every commit's info, oldest first.

        On moto, delta-rs's `history()` hangs in its log listing (the target never lists the log that way),
        so there the commits' `commitInfo` is read from `_delta_log/*.json` itself: the same records."""
        if self.fs is None:
            return list(reversed(self.table().history()))
        log = self.uri.replace("{topic}", "orders").removeprefix("s3://") + "/_delta_log"
        infos = []
        for info in sorted(self.fs.get_file_info(pafs.FileSelector(log)), key=lambda i: i.path):
            if info.path.endswith(".json"):
                with self.fs.open_input_stream(info.path) as stream:
                    lines = stream.read().decode().splitlines()
                infos += [action["commitInfo"] for action in map(json.loads, lines) if "commitInfo" in action]
        return infos

    def applications(self) -> Counter:
        """How many commits applied each file."""
        return Counter(f["file"] for c in self.commit_infos() for f in applied_files(c))


@pytest.fixture(params=["dir", "s3"])
def place(request, tmp_path) -> Place:
    if request.param == "dir":
        uri = str(tmp_path / "tables" / "{topic}")
        return Place(uri, DeltaSettings(table_uri=uri, group_id="g1", retry=FAST), None, None)
    moto_url = request.getfixturevalue("moto_url")
    bucket = f"delta-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/lake/{{topic}}"
    settings = DeltaSettings(table_uri=uri, group_id="g1", endpoint_url=moto_url, region="us-east-1", retry=FAST)
    storage = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_url, "AWS_ALLOW_HTTP": "true"}
    host = urlsplit(moto_url)
    fs = pafs.S3FileSystem(access_key="testing-key-id", secret_key="testing-secret-key", region="us-east-1",
                           endpoint_override=f"{host.hostname}:{host.port}", scheme="http")
    return Place(uri, settings, storage, fs)


@pytest.fixture
def parquet(tmp_path) -> Callable[..., Path]:
    """parquet(rows, schema=SCHEMA) -> a Parquet file holding them."""

    def write(rows: list[dict], schema: pa.Schema = SCHEMA) -> Path:
        path = tmp_path / f"file-{uuid.uuid4().hex}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        return path

    return write


def row(key: int, offset: int, status: str = "NEW", amount: float = 1.0, deleted: bool = False) -> dict:
    return {"id": key, "status": status, "amount": amount, "_offset": offset, "_deleted": deleted}


def span(rows: list[dict], partition: int = 0) -> FileMetadata:
    offsets = [r["_offset"] for r in rows]
    return metadata(partition=partition, first_offset=min(offsets), last_offset=max(offsets), record_count=len(rows))


def merge_one(target: DeltaTarget, path: Path, meta: FileMetadata, on_retry=None) -> dict:
    """What the service's driver does with one staged file: a merge that skips what the table holds."""
    return target.merge([DeltaFile(path, meta)], on_retry)[0]


def upload(target: DeltaTarget, parquet: Callable[..., Path], rows: list[dict], partition: int = 0) -> dict:
    return merge_one(target, parquet(rows), span(rows, partition))


def test_latest_row_per_key_through_updates_and_soft_deletes(place, parquet):
    target = place.target()
    upload(target, parquet, [row(1, 0), row(2, 1), row(1, 2, "PAID"), row(3, 3)])  # key 1 twice in one file
    upload(target, parquet, [row(2, 4, "SHIPPED"), row(3, 5, deleted=True), row(4, 6)])
    upload(target, parquet, [row(1, 7, "REFUNDED", 9.5), row(4, 8, "PAID")])

    expected = {1: row(1, 7, "REFUNDED", 9.5), 2: row(2, 4, "SHIPPED"), 3: row(3, 5, deleted=True),
                4: row(4, 8, "PAID")}
    assert place.rows() == expected
    assert place.rows_from_files() == expected
    assert set(place.applications().values()) == {1}
    assert len(place.applications()) == 3


def test_a_replayed_file_changes_nothing_and_is_applied_once(place, parquet):
    target = place.target()
    rows = [row(1, 10), row(2, 11)]
    path = parquet(rows)
    first = merge_one(target, path, span(rows))
    version = place.table().version()

    again = merge_one(target, path, span(rows))  # the same worker replays it (its upload was not committed in Kafka)
    fresh = merge_one(place.target(), path, span(rows))  # a restarted service replays it

    assert place.table().version() == version
    assert again["skipped"] and fresh["skipped"] and not first["skipped"]
    assert place.applications() == Counter({span(rows).file_name(): 1})
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/0") == 12


def test_a_replay_whose_file_overlaps_the_table_applies_only_the_new_offsets(place, parquet):
    target = place.target()
    upload(target, parquet, [row(1, 10, "A"), row(2, 11, "A")])
    # After a crash the range is read again from Kafka's (older) committed offset and cut differently.
    receipt = upload(place.target(), parquet, [row(1, 10, "A"), row(2, 11, "A"), row(2, 12, "B"), row(3, 13, "B")])

    assert receipt["rows"] == 2  # offsets 12 and 13 only
    assert place.rows() == {1: row(1, 10, "A"), 2: row(2, 12, "B"), 3: row(3, 13, "B")}
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/0") == 14


def test_an_older_file_applied_late_moves_no_key_back(place, parquet):
    target = place.target()
    upload(target, parquet, [row(1, 50, "NEW"), row(2, 51, "NEW")], partition=0)
    # The same keys with lower order values, under another transaction (a hand push, another partition):
    # the order column rule, not the transaction, keeps them out.
    upload(target, parquet, [row(1, 5, "OLD"), row(2, 60, "NEWER"), row(9, 6, "OTHER")], partition=1)

    assert place.rows() == {1: row(1, 50), 2: row(2, 60, "NEWER"), 9: row(9, 6, "OTHER")}


def test_a_file_that_changes_no_row_still_records_its_range_and_a_replay_is_skipped(place, parquet):
    target = place.target()
    upload(target, parquet, [row(1, 50, "NEW"), row(2, 51, "NEW")], partition=0)
    older = [row(1, 5, "OLD"), row(2, 6, "OLD")]  # partition 1: every row older than the table's
    first = upload(target, parquet, older, partition=1)
    # delta-rs commits nothing for a merge that changes no row, not even its application transaction:
    # the range is recorded by a commit without rows.
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/1") == 7
    assert first["committed_version"] == place.table().version()
    replay = upload(place.target(), parquet, older, partition=1)
    assert replay["skipped"]
    assert place.rows() == {1: row(1, 50), 2: row(2, 51)}
    assert place.applications() == Counter({span(older, 1).file_name(): 1,
                                            span([row(1, 50), row(2, 51)]).file_name(): 1})


def test_hard_deletes_remove_the_row_and_an_older_delete_does_not(place, parquet):
    target = place.target(hard_deletes=True)
    upload(target, parquet, [row(1, 0), row(2, 1), row(3, 2)])
    upload(target, parquet, [row(1, 3, deleted=True), row(5, 4, deleted=True), row(2, 5, "PAID")])
    upload(target, parquet, [row(2, 0, deleted=True)], partition=1)  # older than the table's row of key 2

    assert place.rows() == {2: row(2, 5, "PAID"), 3: row(3, 2)}
    assert place.rows_from_files() == place.rows()


def test_a_table_is_created_partitioned_when_asked(place, parquet):
    target = place.target(partition_by=("status",))
    upload(target, parquet, [row(1, 0, "NEW"), row(2, 1, "PAID")])
    assert place.table().metadata().partition_columns == ["status"]
    assert place.rows() == {1: row(1, 0, "NEW"), 2: row(2, 1, "PAID")}


def test_new_columns_are_added_and_a_narrowing_is_a_content_rejection(place, parquet, tmp_path):
    target = place.target()
    upload(target, parquet, [row(1, 0)])
    wider = SCHEMA.append(pa.field("note", pa.string()))
    merge_one(target, parquet([{**row(2, 1), "note": "hello"}], wider), span([row(2, 1)]))
    assert place.rows()[2]["note"] == "hello" and place.rows()[1]["note"] is None

    narrow = pa.schema([("id", pa.int64()), ("status", pa.string()), ("amount", pa.string()),
                        ("_offset", pa.int64()), ("_deleted", pa.bool_())])
    bad = {**row(3, 2), "amount": "a lot"}
    with pytest.raises(FatalUploadError) as caught:
        merge_one(target, parquet([bad], narrow), span([bad]))
    error = caught.value
    assert error.reason == NARROWING and error.setting == "SINK_REJECTED_FILE_POLICY"
    for words in ("topic orders", "partition 0", "offsets 2-2", "'amount'", "SINK_REJECTED_FILE_POLICY=park",
                  "SINK_DELTA_WIDEN_TO_STRING=true"):
        assert words in str(error)


    parking = ParkingTarget(place.target(), DirectorySettings(path=str(tmp_path / "parked")))
    receipt = parking.upload(parquet([bad], narrow), span([bad]))
    assert receipt.target == PARKED_TARGET
    sidecar = json.loads(Path(receipt.location + ".response.json").read_text())
    assert sidecar["reason"] == NARROWING
    assert set(place.rows()) == {1, 2}


def typed(amount: pa.DataType) -> pa.Schema:
    """SCHEMA with `amount` of another type."""
    return pa.schema([f.with_type(amount) if f.name == "amount" else f for f in SCHEMA])


def widenings(place: Place) -> list[str]:
    """The `name: old -> new` records of the table's widening rewrites, oldest first."""
    return [c[META_WIDENED] for c in reversed(place.table().history()) if META_WIDENED in c]


def test_a_double_for_a_long_column_widens_the_table_once_and_keeps_the_transactions(place, parquet):
    """delta-rs alone would store 9.5 as 9 in a long column; the table is rewritten with amount as double."""
    target = place.target()
    first = [{**row(1, 0), "amount": 1}, {**row(2, 1), "amount": 2}]
    merge_one(target, parquet(first, typed(pa.int64())), span(first))
    other = [{**row(7, 40), "amount": 7}]
    merge_one(target, parquet(other, typed(pa.int64())), span(other, partition=3))
    wider = [{**row(2, 2), "amount": 9.5}, {**row(3, 3), "amount": 2.0**53}]
    merge_one(target, parquet(wider, typed(pa.float64())), span(wider))

    assert pa.schema(place.table().schema().to_arrow()).field("amount").type == pa.float64()
    expected = {1: {**row(1, 0), "amount": 1.0}, 2: {**row(2, 2), "amount": 9.5}, 3: {**row(3, 3), "amount": 2.0**53},
                7: {**row(7, 40), "amount": 7.0}}
    assert place.rows() == expected
    assert place.rows_from_files() == expected
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/0") == 4
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/3") == 41
    if place.fs is None:
        assert widenings(place) == ["amount: int64 -> double"]
    assert set(place.applications().values()) == {1} and len(place.applications()) == 3

    # Replays after the widening are still skipped; a later int file is cast up, no second rewrite.
    assert merge_one(target, parquet(wider, typed(pa.float64())), span(wider))["skipped"]
    later = [{**row(4, 4), "amount": 4}]
    merge_one(target, parquet(later, typed(pa.int64())), span(later))
    assert place.rows()[4]["amount"] == 4.0
    if place.fs is None:
        assert len(widenings(place)) == 1


def test_an_int_file_into_a_double_column_is_cast_up_and_an_inexact_one_refused(place, parquet):
    target = place.target()
    upload(target, parquet, [row(1, 0, amount=0.5)])
    version = place.table().version()
    ints = [{**row(2, 1), "amount": 3}]
    merge_one(target, parquet(ints, typed(pa.int64())), span(ints))
    assert place.rows()[2]["amount"] == 3.0 and place.table().version() == version + 1  # no rewrite
    assert pa.schema(place.table().schema().to_arrow()).field("amount").type == pa.float64()

    # 2**53 + 1 has no exact double: the lattice makes it text, which needs SINK_DELTA_WIDEN_TO_STRING.
    big = [{**row(3, 2), "amount": 2**53 + 1}]
    with pytest.raises(FatalUploadError) as caught:
        merge_one(target, parquet(big, typed(pa.int64())), span(big))
    assert caught.value.reason == NARROWING and "'amount'" in str(caught.value)
    assert set(place.rows()) == {1, 2}


def test_a_string_for_a_long_column_is_refused_unless_widening_to_text_is_allowed(place, parquet):
    target = place.target()
    first = [{**row(1, 0), "amount": 12}, {**row(2, 1), "amount": 2**60}]
    merge_one(target, parquet(first, typed(pa.int64())), span(first))
    text = [{**row(3, 2), "amount": "a lot"}]
    with pytest.raises(FatalUploadError) as caught:
        merge_one(target, parquet(text, typed(pa.string())), span(text))
    error = caught.value
    assert error.reason == NARROWING and error.setting == "SINK_REJECTED_FILE_POLICY"
    for words in ("topic orders", "partition 0", "offsets 2-2", "'amount'", "SINK_REJECTED_FILE_POLICY=park",
                  "SINK_DELTA_WIDEN_TO_STRING=true"):
        assert words in str(error)
    assert pa.schema(place.table().schema().to_arrow()).field("amount").type == pa.int64()

    allowed = place.target(widen_to_string=True)
    merge_one(allowed, parquet(text, typed(pa.string())), span(text))
    expected = {1: {**row(1, 0), "amount": "12"}, 2: {**row(2, 1), "amount": str(2**60)},
                3: {**row(3, 2), "amount": "a lot"}}
    assert place.rows() == expected and place.rows_from_files() == expected
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/0") == 3
    later = [{**row(4, 3), "amount": 1.5}]  # a double now fits the text column as the decoder writes it
    merge_one(allowed, parquet(later, typed(pa.float64())), span(later))
    assert place.rows()[4]["amount"] == "1.5"


def test_a_widening_that_loses_a_race_is_a_retried_conflict_applied_once(place, parquet, monkeypatch):
    """Another writer commits between our read and our rewrite: the rewrite fails as `delta_conflict`,
    the retry re-reads the table (and its transactions) and widens it; nothing lost, nothing twice."""
    import uploader.delta as delta_module

    target, rival = place.target(), place.target()
    first = [{**row(1, 0), "amount": 1}]
    merge_one(target, parquet(first, typed(pa.int64())), span(first))
    real = delta_module.write_deltalake
    raced: list[int] = []

    def racing(table, data, **kwargs):
        if kwargs.get("mode") == "overwrite" and not raced:
            raced.append(1)
            theirs = [{**row(5, 100), "amount": 5}]
            merge_one(rival, parquet(theirs, typed(pa.int64())), span(theirs, partition=1))
        return real(table, data, **kwargs)

    monkeypatch.setattr(delta_module, "write_deltalake", racing)
    retries: Counter = Counter()
    wider = [{**row(2, 1), "amount": 2.5}]
    merge_one(target, parquet(wider, typed(pa.float64())), span(wider),
                  on_retry=lambda e, attempt, wait: retries.update([e.reason]))

    assert retries == Counter({CONFLICT: 1})
    expected = {1: {**row(1, 0), "amount": 1.0}, 2: {**row(2, 1), "amount": 2.5}, 5: {**row(5, 100), "amount": 5.0}}
    assert place.rows() == expected
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/1") == 101
    assert set(place.applications().values()) == {1} and len(place.applications()) == 3


def test_two_writers_on_one_table_retry_their_conflicts_and_lose_nothing(place, parquet):
    """Two targets (two services) merge files of their own partitions into one table at once, and both
    also race to apply the same files: every conflict is retried, every row lands, each file once."""
    retries: Counter = Counter()
    files = {p: [[row(1000 * p + k, 10 * n + k, f"v{n}") for k in range(5)] for n in range(4)] for p in range(2)}
    shared = [[row(500 + k, 100 * n + k, f"s{n}") for k in range(3)] for n in range(3)]
    shared_paths = [parquet(rows) for rows in shared]
    errors: list[BaseException] = []

    def writer(partition: int) -> None:
        target = place.target()
        try:
            for rows in files[partition]:
                merge_one(target, parquet(rows), span(rows, partition),
                              on_retry=lambda e, attempt, wait: retries.update([e.reason]))
            for rows, path in zip(shared, shared_paths, strict=True):  # both writers apply partition 9's files
                merge_one(target, path, span(rows, 9), on_retry=lambda e, attempt, wait: retries.update([e.reason]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert not errors
    expected = {r["id"]: r for group in (*files[0], *files[1]) for r in group}
    expected.update({r["id"]: r for r in shared[-1]})
    assert place.rows() == expected
    assert place.rows_from_files() == expected
    applications = place.applications()
    assert len(applications) == 8 + 3 and set(applications.values()) == {1}
    assert set(retries) <= {CONFLICT}
    print(f"conflicts retried: {retries[CONFLICT]}; applications per file: {sorted(set(applications.values()))}")


def test_without_primary_keys_rows_are_appended_once(place, parquet):
    target = place.target()
    rows = [row(1, 0), row(1, 1)]
    path = parquet(rows)
    for _ in range(2):
        merge_one(target, path, dataclasses.replace(span(rows), primary_keys=(), order_column=None))
    assert place.table().to_pyarrow_table().num_rows == 2


def test_the_service_configuration_builds_a_delta_target(monkeypatch, tmp_path):
    env = {"SINK_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "SINK_TOPICS": "orders", "SINK_GROUP_ID": "grp",
           "SINK_TARGET": "delta", "SINK_DELTA_TABLE_URI": str(tmp_path / "{topic}"), "SINK_PRIMARY_KEYS": "id",
           "SINK_DELTA_PARTITION_BY": "status"}
    config = load_config(env)
    settings = target_settings(config)
    assert isinstance(settings, DeltaSettings)
    assert settings.app_id("orders", 2) == "kafka-parquet-sink/grp/orders/2"
    assert settings.partition_by == ("status",)
    assert isinstance(build_target(settings), DeltaTarget)

    with pytest.raises(ConfigError, match="SINK_DELTA_TABLE_URI is required"):
        load_config({**env, "SINK_DELTA_TABLE_URI": ""})
    with pytest.raises(ConfigError, match="SINK_DELTA_HARD_DELETES=true needs SINK_TOMBSTONES=soft-delete"):
        load_config({**env, "SINK_DELTA_HARD_DELETES": "true"})
    with pytest.raises(ConfigError, match="SINK_DELTA_HARD_DELETES=true needs SINK_ORDER_FIELD=_offset"):
        load_config({**env, "SINK_DELTA_HARD_DELETES": "true", "SINK_TOMBSTONES": "soft-delete",
                     "SINK_ORDER_FIELD": "updated_at"})


# --- several files in one commit (DeltaTarget.merge, as the driver merges a micro-batch) -----------------

FILES = [  # (partition, rows): partition 0 in two files, partition 1 in one; keys cross partitions
    (0, [row(1, 0), row(2, 1), row(1, 2, "PAID")]),
    (1, [row(3, 0), row(1, 1, "OTHER"), row(4, 2)]),
    (0, [row(2, 3, "SHIPPED"), row(3, 4, deleted=True), row(5, 5)]),
]


def _files(parquet, files) -> list[DeltaFile]:
    return [DeltaFile(parquet(rows), span(rows, partition)) for partition, rows in files]


def test_one_commit_applies_every_file_as_one_at_a_time_would(place, parquet, tmp_path):
    details, attempts = place.target().merge(_files(parquet, FILES))

    assert attempts == 1
    history = [c for c in place.commit_infos() if applied_files(c)]
    assert len(history) == 1, "one commit for the whole batch"
    assert [f["file"] for f in applied_files(history[0])] == [span(r, p).file_name() for p, r in FILES]
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/0") == 6
    assert place.table().transaction_version("kafka-parquet-sink/g1/orders/1") == 3
    assert details["committed_version"] == place.table().version()

    one_by_one = type(place)(str(tmp_path / "one" / "{topic}"), type(place.settings)(
        table_uri=str(tmp_path / "one" / "{topic}"), group_id="g1"), None, None)
    target = one_by_one.target()
    for partition, rows in FILES:
        merge_one(target, parquet(rows), span(rows, partition))
    assert place.rows() == one_by_one.rows()
    assert place.rows_from_files() == one_by_one.rows()


def test_a_tie_on_the_order_column_keeps_the_earlier_file_as_one_at_a_time_would(place, parquet):
    # Two partitions carry key 7 with the same order value: applied one by one, the later file does not
    # replace the row (a row replaces only with a higher value); within one file the later row wins.
    files = [(0, [row(7, 5, "FIRST"), row(7, 5, "FIRST-LATER-ROW")]), (1, [row(7, 5, "SECOND")])]
    place.target().merge(_files(parquet, files))
    assert place.rows()[7]["status"] == "FIRST-LATER-ROW"


def test_files_the_table_holds_are_skipped_and_an_overlap_is_cut(place, parquet):
    target = place.target()
    merge_one(target, parquet([row(1, 0), row(2, 1)]), span([row(1, 0), row(2, 1)]))
    replay = [(0, [row(1, 0), row(2, 1)]),  # held: skipped
              (0, [row(2, 1), row(3, 2, "NEW")]),  # overlaps: only offset 2
              (1, [row(9, 0)])]
    details, _ = place.target().merge(_files(parquet, replay))

    assert details["skipped_files"] == [span(replay[0][1]).file_name()]
    applied = {f["file"]: f for f in details["applied"]}
    assert applied[span(replay[1][1]).file_name()]["applied_from"] == 2
    assert place.rows() == {1: row(1, 0), 2: row(2, 1), 3: row(3, 2, "NEW"), 9: row(9, 0)}
    assert set(place.applications().values()) == {1}


def test_a_file_that_does_not_fit_is_named_alone_and_nothing_is_committed(place, parquet):
    target = place.target()
    merge_one(target, parquet([row(1, 0)]), span([row(1, 0)]))
    version = place.table().version()
    texty = pa.schema([f.with_type(pa.string()) if f.name == "amount" else f for f in SCHEMA])
    bad = [{**row(3, 1), "amount": "a lot"}]
    files = [DeltaFile(parquet([row(2, 0)]), span([row(2, 0)], 1)), DeltaFile(parquet(bad, texty), span(bad))]

    with pytest.raises(DeltaRefusal) as refused:
        target.merge(files)

    assert refused.value.reason == NARROWING
    assert refused.value.files == [span(bad)]
    assert "partition 0, offsets 1-1" in str(refused.value)
    assert place.table().version() == version


def test_a_wider_column_in_one_file_and_a_new_one_in_two_types_widen_once(place, parquet):
    target = place.target()
    merge_one(target, parquet([row(1, 0)]), span([row(1, 0)]))
    longs = pa.schema([*SCHEMA, ("qty", pa.int64())])
    doubles = pa.schema([*(f.with_type(pa.float64()) if f.name == "id" else f for f in SCHEMA),
                         ("qty", pa.float64())])
    a = [{**row(2, 1), "qty": 3}]
    b = [{**row(3, 0), "id": 3.0, "qty": 2.5}]
    target.merge([DeltaFile(parquet(a, longs), span(a)), DeltaFile(parquet(b, doubles), span(b, 1))])

    schema = pa.schema(place.table().schema().to_arrow())
    assert pa.types.is_floating(schema.field("id").type) and pa.types.is_floating(schema.field("qty").type)
    assert {k: r["qty"] for k, r in place.rows().items()} == {1.0: None, 2.0: 3.0, 3.0: 2.5}
