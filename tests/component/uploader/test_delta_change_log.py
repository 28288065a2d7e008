"""Change-log mode: what a reader sees through the view equals each key's latest record, field by field, however
the files are batched and whenever compactions run; after a compaction the keyed table alone does too.

The scenarios are the merge mode's (test_delta_exact_rows): fields new inside objects, cleared fields, soft and
hard deletes. Compactions run after every append, only at the end, or never (the view alone), and a compaction
interrupted between its commit and its clean-up (the change log keeps applied rows) changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tests.component.uploader.test_delta_exact_rows import (
    BATCHINGS,
    CLEARED,
    CUSTOMER_GROWS,
    FAST,
    LIST_OF_STRUCTS_GROWS,
    SOFT_DELETES,
    TOPIC,
    _expected,
    _files,
    _without_nulls,
)
from uploader.delta import DeltaFile
from uploader.delta_changes import CHANGE_VERSION, ChangeLogTarget, buckets_of
from uploader.delta_compaction import Compaction
from uploader.delta_settings import BUCKET, DeltaSettings
from uploader.delta_storage import storage_options
from uploader.delta_view import current_rows

COMPACTIONS = ("after each append", "at the end", "never")
APP_ID = f"kafka-parquet-sink/g/{TOPIC}/0"


def _settings(tmp: Path, **overrides: Any) -> DeltaSettings:
    return DeltaSettings(**{"table_uri": str(tmp / "table"), "group_id": "g", "retry": FAST, "change_log": True,
                            "buckets": 4, **overrides})


def _run(tmp: Path, files: list[DeltaFile], batching: str, compactions: str, **overrides: Any) -> DeltaSettings:
    settings = _settings(tmp, **overrides)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp / "scratch", keep_applied_s=0)
    keys, order = files[0].metadata.primary_keys, files[0].metadata.order_column
    for group in BATCHINGS[batching](len(files)):
        target.merge([files[i] for i in group])
        if compactions == "after each append":
            compaction.compact(TOPIC, keys, order)
    if compactions == "at the end":
        compaction.compact(TOPIC, keys, order)
    return settings


def _rows(table: pa.Table) -> dict[int, dict]:
    return {r["id"]: _without_nulls({k: v for k, v in r.items() if k != BUCKET}) for r in table.to_pylist()}


def _view(settings: DeltaSettings, order: str = "_offset") -> dict[int, dict]:
    return _rows(current_rows(settings, TOPIC, ("id",), order))


PHASES = [*CUSTOMER_GROWS, *SOFT_DELETES, *CLEARED, *LIST_OF_STRUCTS_GROWS]


@pytest.mark.parametrize("compactions", COMPACTIONS)
@pytest.mark.parametrize("batching", list(BATCHINGS))
def test_the_view_equals_each_keys_latest_record_whenever_compactions_run(tmp_path: Path, batching: str,
                                                                          compactions: str) -> None:
    settings = _run(tmp_path, _files(tmp_path, PHASES), batching, compactions)
    assert _view(settings) == _expected(PHASES)
    if compactions != "never":
        assert _rows(DeltaTable(settings.uri_for(TOPIC)).to_pyarrow_table()) == _expected(PHASES)
        assert DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_table().num_rows == 0, "applied rows deleted"


@pytest.mark.parametrize("compactions", COMPACTIONS)
def test_hard_deletes_through_the_change_log(tmp_path: Path, compactions: str) -> None:
    phases = [[(1, {"amount": 1}), (2, {"amount": 2})], [(1, None)], [(1, {"amount": 3}), (2, None)], [(3, None)]]
    settings = _run(tmp_path, _files(tmp_path, phases), "each file alone", compactions, hard_deletes=True)
    expected = {k: v for k, v in _expected(phases).items() if not v["_deleted"]}
    assert _view(settings) == expected
    if compactions != "never":
        assert _rows(DeltaTable(settings.uri_for(TOPIC)).to_pyarrow_table()) == expected


def test_the_order_column_rule_holds_across_the_change_log_and_the_keyed_table(tmp_path: Path) -> None:
    """A row older by the order column than the key's row, in the keyed table or earlier in the change log, never
    wins: in the view, and in the table after a compaction."""
    settings = _settings(tmp_path)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp_path / "scratch", keep_applied_s=0)
    newer = _files(tmp_path / "a", [[(1, {"version": 5, "amount": 50}), (2, {"version": 5, "amount": 50})]],
                   bookkeeping=True)
    target.merge(newer)
    compaction.compact(TOPIC, ("id",), "version")
    older = _files(tmp_path / "b", [[(1, {"version": 3, "amount": 30}), (3, {"version": 1, "amount": 10})]],
                   bookkeeping=True, start=2)
    target.merge(older)
    view = _view(settings, order="version")
    assert view[1]["amount"] == 50 and view[2]["amount"] == 50 and view[3]["amount"] == 10
    compaction.compact(TOPIC, ("id",), "version")
    table = _rows(DeltaTable(settings.uri_for(TOPIC)).to_pyarrow_table())
    assert {k: v["amount"] for k, v in table.items()} == {1: 50, 2: 50, 3: 10}


def test_a_replay_is_never_appended_twice_and_resumes_from_the_change_logs_transactions(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    target = ChangeLogTarget(settings)
    files = _files(tmp_path, [[(k, {"amount": k}) for k in range(4)], [(k, {"amount": 10 + k}) for k in range(2)]])
    target.merge(files)
    assert target.covered_to(TOPIC, 0) == 6
    details, _ = ChangeLogTarget(settings).merge(files)  # the replay after a crash before the Kafka commit
    assert details["skipped"] and len(details["skipped_files"]) == 2
    assert DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_table().num_rows == 4, "the latest row per key"
    assert DeltaTable(settings.changes_uri_for(TOPIC)).transaction_version(APP_ID) == 6


def test_a_keyed_table_written_in_merge_mode_keeps_its_progress_when_the_change_log_starts(tmp_path: Path) -> None:
    from uploader.delta import DeltaTarget

    merged = _settings(tmp_path, change_log=False)
    files = _files(tmp_path, [[(k, {"amount": k}) for k in range(4)], [(1, {"amount": 11})]])
    DeltaTarget(merged).merge(files[:1])
    settings = _settings(tmp_path)
    target = ChangeLogTarget(settings)
    assert target.covered_to(TOPIC, 0) == 4
    details, _ = target.merge(files)
    assert [a["file"] for a in details["applied"]] == [files[1].metadata.file_name()], "the first file is held"
    assert _view(settings) == _expected([[(k, {"amount": k}) for k in range(4)], [(1, {"amount": 11})]])


def test_a_compaction_cut_between_its_commit_and_its_clean_up_applies_nothing_twice(tmp_path: Path) -> None:
    """The keyed table's per-bucket transaction says what it holds: the view skips those change-log rows, and the
    next compaction neither re-applies them (a hard-deleted key would come back) nor loses later ones."""
    settings = _settings(tmp_path, hard_deletes=True)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp_path / "scratch", keep_applied_s=0)
    phases = [[(1, {"amount": 1}), (2, {"amount": 2})], [(1, None)]]
    files = _files(tmp_path, phases)
    target.merge(files[:1])
    compaction._delete_applied = lambda *_: None  # type: ignore[method-assign]  # the crash: no clean-up
    compaction.compact(TOPIC, ("id",), "_offset")
    target.merge(files[1:])
    assert DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_table().num_rows == 3, "applied rows still there"
    expected = {k: v for k, v in _expected(phases).items() if not v["_deleted"]}
    assert _view(settings) == expected
    Compaction(settings, tmp_path / "scratch", keep_applied_s=0).compact(TOPIC, ("id",), "_offset")
    assert _rows(DeltaTable(settings.uri_for(TOPIC)).to_pyarrow_table()) == expected
    assert DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_table().num_rows == 0


def test_a_compaction_rewrites_only_the_buckets_it_applies(tmp_path: Path) -> None:
    """Pinned to one bucket per merge: files of a bucket without changes are never rewritten."""
    settings = _settings(tmp_path)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp_path / "scratch", keep_applied_s=0)
    target.merge(_files(tmp_path / "a", [[(k, {"amount": k}) for k in range(200)]]))
    compaction.compact(TOPIC, ("id",), "_offset")
    keyed = DeltaTable(settings.uri_for(TOPIC))
    before = set(keyed.file_uris())
    one_key = pa.table({"id": [7]})
    bucket = buckets_of(one_key, ("id",), settings.buckets)[0].as_py()
    target.merge(_files(tmp_path / "b", [[(7, {"amount": 70})]], start=200))
    result = compaction.compact(TOPIC, ("id",), "_offset")
    keyed.update_incremental()
    after = set(keyed.file_uris())
    assert result["buckets"] == 1
    assert all(f"{BUCKET}={bucket}" in uri for uri in before - after), "only the changed bucket's files replaced"
    assert len(before - after) >= 1 and len(before & after) >= 1
    assert _rows(keyed.to_pyarrow_table())[7]["amount"] == 70


def test_buckets_are_stable_and_key_text_makes_an_int_and_its_digits_alike() -> None:
    ints = buckets_of(pa.table({"id": [1, 2, 3, 1_000_000]}), ("id",), 16).to_pylist()
    texts = buckets_of(pa.table({"id": ["1", "2", "3", "1000000"]}), ("id",), 16).to_pylist()
    assert ints == texts
    assert ints == [zlib_bucket(v, 16) for v in ("1", "2", "3", "1000000")]


def test_buckets_are_zlibs_crc32_of_every_kind_of_key_text() -> None:
    """The vectorised CRC-32 must equal zlib's for every key a table already holds: a bucket that moved would put a
    key's new rows beside its old row in another partition, and the pinned merge would insert it twice."""
    import random

    draw = random.Random(7)
    texts = ["", "7", "a\x1fb", "ü€😀", "x" * 300,
             *("".join(chr(draw.randrange(1, 0x2FFF)) for _ in range(draw.randrange(0, 40))) for _ in range(5000))]
    keys = pa.table({"id": pa.chunked_array([pa.array(texts[:7]), pa.array(texts[7:])]).slice(2)})
    assert buckets_of(keys, ("id",), 16).to_pylist() == [zlib_bucket(t, 16) for t in texts[2:]]
    two = pa.table({"a": [1, None, 3], "b": ["x", "y", None]})
    assert buckets_of(two, ("a", "b"), 7).to_pylist() == [zlib_bucket(t, 7) for t in ("1\x1fx", "\x1fy", "3\x1f")]


def zlib_bucket(text: str, buckets: int) -> int:
    import zlib

    return zlib.crc32(text.encode()) % buckets


def test_change_rows_carry_their_change_log_version(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    target = ChangeLogTarget(settings)
    target.merge(_files(tmp_path / "a", [[(1, {"amount": 1})]]))
    target.merge(_files(tmp_path / "b", [[(2, {"amount": 2})]], start=1))
    changes = DeltaTable(settings.changes_uri_for(TOPIC))
    rows = sorted(changes.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    versions = [r[CHANGE_VERSION] for r in rows]
    assert versions[0] < versions[1] <= changes.version()
    assert changes.metadata().partition_columns == [BUCKET]


def test_a_compaction_is_due_at_its_share_of_the_table_or_after_its_interval(tmp_path: Path) -> None:
    settings = _settings(tmp_path, compact_at_ratio=0.5, compact_max_interval_s=30)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp_path / "scratch", keep_applied_s=0)
    assert not compaction.due(TOPIC), "no change log yet"
    target.merge(_files(tmp_path / "a", [[(k, {"amount": k}) for k in range(2000)]]))
    assert compaction.due(TOPIC, now=0.0), "no keyed table yet: any change is half of nothing"
    compaction.compact(TOPIC, ("id",), "_offset")
    sizes = compaction.sizes(TOPIC)
    assert sizes is not None and sizes.changes == 0 and sizes.table > 0
    assert not compaction.due(TOPIC), "nothing pending"
    target.merge(_files(tmp_path / "b", [[(1, {"amount": 10})]], start=2000))
    last = compaction._last[settings.uri_for(TOPIC)]
    assert not compaction.due(TOPIC, now=last + 1), "one row is far below half the table"
    assert compaction.due(TOPIC, now=last + 31), "the interval passed with changes pending"


def test_the_change_log_is_never_optimized(tmp_path: Path) -> None:
    """Small-file compaction would mix applied and pending rows in one file (bench/delta_table_sizes at 10M keys)."""
    settings = _settings(tmp_path, compact_every_commits=1)
    target = ChangeLogTarget(settings)
    for n in range(3):
        target.merge(_files(tmp_path / str(n), [[(k, {"amount": n}) for k in range(20)]], start=20 * n))
    operations = [c["operation"] for c in DeltaTable(settings.changes_uri_for(TOPIC)).history()]
    assert "OPTIMIZE" not in operations and operations.count("WRITE") == 3


def test_an_append_that_loses_its_commit_race_is_tried_again_at_once(tmp_path: Path, monkeypatch) -> None:
    """A lost race (to the clean-up of applied rows, or to a zombie's append of the same partition: delta-rs rebases
    only over other appends) is re-read and retried without the backoff of the outer retries; a real rival commit
    in between too."""
    from uploader.delta import DeltaTarget
    from uploader.errors import RetryableUploadError

    settings = _settings(tmp_path)
    target = ChangeLogTarget(settings)
    real = DeltaTarget._apply
    rivals = [lambda: ChangeLogTarget(settings).merge(_files(tmp_path / "rival", [[(9, {"amount": 9})]]))]
    lost = []

    def racing(self, *args, **kwargs):
        if rivals:  # another instance commits right before ours: ours conflicts
            rivals.pop()()
            lost.append(1)
            raise RetryableUploadError("another writer committed first", reason="delta_conflict")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTarget, "_apply", racing)
    retried: list = []
    details, attempts = target.merge(_files(tmp_path / "ours", [[(1, {"amount": 1})]], start=1),
                                     on_retry=lambda *a: retried.append(a))
    assert lost == [1] and attempts == 1 and not retried, "retried at once, inside one attempt of the caller"
    assert not details["skipped"]
    assert sorted(_view(settings)) == [1, 9]


def _with_rival_inside_our_append(monkeypatch, rival) -> None:
    """Run `rival` once, inside the next change-log append: after its rows are stamped, before its commit."""
    import uploader.delta_changes as delta_changes

    real = delta_changes.write_deltalake
    pending_rival = [rival]

    def racing(*args, **kwargs):
        if pending_rival:
            pending_rival.pop()()
        return real(*args, **kwargs)

    monkeypatch.setattr(delta_changes, "write_deltalake", racing)


def test_two_instances_appending_at_once_both_commit_without_a_conflict(tmp_path: Path, monkeypatch) -> None:
    """Appends are rebased by delta-rs over another instance's commits instead of failing (bench: two instances
    appended at 0.64x one instance, the loser re-reading and re-writing its batch after each lost race)."""
    from uploader.delta import DeltaTarget

    settings = _settings(tmp_path)
    _with_rival_inside_our_append(monkeypatch, lambda: ChangeLogTarget(settings).merge(
        _files(tmp_path / "rival", [[(9, {"amount": 9})]], partition=1)))
    real_apply, tries = DeltaTarget._apply, []
    monkeypatch.setattr(DeltaTarget, "_apply", lambda self, *a, **kw: tries.append(1) or real_apply(self, *a, **kw))
    details, _ = ChangeLogTarget(settings).merge(_files(tmp_path / "ours", [[(1, {"amount": 1})]]))
    assert len(tries) == 2, "the rival's append and ours, each tried once"
    changes = DeltaTable(settings.changes_uri_for(TOPIC))
    ours = [r for r in changes.to_pyarrow_table().to_pylist() if r["id"] == 1]
    assert details["version"] == changes.version() and ours[0][CHANGE_VERSION] < details["version"], \
        "our rows keep the stamp of the snapshot they were written on"
    assert sorted(_view(settings)) == [1, 9]
    assert changes.transaction_version(APP_ID) == 1 and changes.transaction_version(
        f"kafka-parquet-sink/g/{TOPIC}/1") == 1


def test_an_append_stamped_below_a_compaction_that_committed_meanwhile_is_applied_and_kept_until_then(
        tmp_path: Path, monkeypatch) -> None:
    """Our rows are stamped on the snapshot they were written on; a rival appends and a compaction applies the change
    log through the rival's version before ours commits. Ours sits below that version: the view, the next
    compaction and the clean-up must still treat it as pending, by the commits' stamps, not by its stamp alone."""
    settings = _settings(tmp_path)

    def rival_then_compaction() -> None:  # keeping what it applied (a clean-up now would fail our append outright)
        ChangeLogTarget(settings).merge(_files(tmp_path / "rival", [[(9, {"amount": 9})]], partition=1))
        Compaction(settings, tmp_path / "scratch", keep_applied_s=3600).compact(TOPIC, ("id",), "_offset")

    ChangeLogTarget(settings).merge(_files(tmp_path / "first", [[(1, {"amount": 0}), (2, {"amount": 0})]]))
    _with_rival_inside_our_append(monkeypatch, rival_then_compaction)
    details, _ = ChangeLogTarget(settings).merge(_files(tmp_path / "ours", [[(1, {"amount": 1})]], start=2))
    changes = DeltaTable(settings.changes_uri_for(TOPIC))
    ours = [r for r in changes.to_pyarrow_table().to_pylist() if r["id"] == 1 and r["amount"] == 1]
    keyed = DeltaTable(settings.uri_for(TOPIC))
    bucket = ours[0][BUCKET]
    assert ours[0][CHANGE_VERSION] <= keyed.transaction_version(settings.compaction_app_id(bucket)) < details["version"]
    assert _view(settings)[1]["amount"] == 1, "the view shows our update"
    cleaning = Compaction(settings, tmp_path / "scratch", keep_applied_s=0)
    cleaning._delete_applied(DeltaTable(settings.changes_uri_for(TOPIC)), settings.uri_for(TOPIC))
    assert {r["amount"] for r in DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_table().to_pylist()
            if r["id"] == 1} == {1}, "the clean-up deleted the applied row of key 1, not ours"
    cleaning.compact(TOPIC, ("id",), "_offset")  # applies ours, then deletes it
    keyed = DeltaTable(settings.uri_for(TOPIC))
    assert {r["id"]: r["amount"] for r in keyed.to_pyarrow_table().to_pylist()} == {1: 1, 2: 0, 9: 9}
    assert DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_table().num_rows == 0
    assert _view(settings)[1]["amount"] == 1


def test_each_instance_starts_its_compactions_at_a_bucket_of_its_own(tmp_path: Path) -> None:
    """Two instances' compactions start together; from different buckets they split the work instead of both
    merging every bucket (the second finds the first's buckets applied, nothing left)."""
    settings = _settings(tmp_path)
    ChangeLogTarget(settings).merge(_files(tmp_path / "a", [[(k, {"amount": k}) for k in range(40)]]))
    Compaction(settings, tmp_path / "scratch", keep_applied_s=3600, first_bucket=2).compact(TOPIC, ("id",), "_offset")
    keyed = DeltaTable(settings.uri_for(TOPIC))
    merges = [c for c in reversed(keyed.history()) if c["operation"] == "MERGE"]
    buckets = [int(c["operationParameters"]["predicate"].split("_bucket = ")[1]) for c in merges]
    assert buckets == [2, 3, 0, 1]


def test_a_change_log_on_s3_reads_its_commits_stamps_from_the_log(moto_url, aws_env, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """The stamps come from the log entries read through boto3 (delta-rs's history() holds the GIL while it reads:
    against this in-process S3 server the view waited on itself for 180 s, then failed)."""
    import uuid

    import boto3

    bucket = f"changes-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    settings = _settings(tmp_path, table_uri=f"s3://{bucket}/lake/{{topic}}", endpoint_url=moto_url,
                         region="us-east-1")
    ChangeLogTarget(settings).merge(_files(tmp_path / "first", [[(1, {"amount": 0}), (2, {"amount": 0})]]))

    def rival_then_compaction() -> None:
        ChangeLogTarget(settings).merge(_files(tmp_path / "rival", [[(9, {"amount": 9})]], partition=1))
        Compaction(settings, tmp_path / "scratch", keep_applied_s=3600).compact(TOPIC, ("id",), "_offset")

    _with_rival_inside_our_append(monkeypatch, rival_then_compaction)
    ChangeLogTarget(settings).merge(_files(tmp_path / "ours", [[(1, {"amount": 1})]], start=2))
    assert {k: r["amount"] for k, r in _view(settings).items()} == {1: 1, 2: 0, 9: 9}
    Compaction(settings, tmp_path / "scratch", keep_applied_s=0).compact(TOPIC, ("id",), "_offset")
    keyed = DeltaTable(settings.uri_for(TOPIC), storage_options=storage_options(settings))
    assert {r["id"]: r["amount"] for r in keyed.to_pyarrow_table().to_pylist()} == {1: 1, 2: 0, 9: 9}


def test_tables_the_service_creates_are_checkpointed_every_ten_commits(tmp_path: Path) -> None:
    """A look at a table (a snapshot update, transaction_version) replays the log since its last checkpoint: one GET
    per entry on S3, ~100 per look at delta-rs's default interval (the compaction thread looks every 10 s)."""
    settings = _settings(tmp_path)
    target = ChangeLogTarget(settings)
    for n in range(12):
        target.merge(_files(tmp_path / str(n), [[(n, {"amount": n})]], start=n))
    changes = DeltaTable(settings.changes_uri_for(TOPIC))
    assert changes.metadata().configuration.get("delta.checkpointInterval") == "10"
    assert list((Path(settings.changes_uri_for(TOPIC)) / "_delta_log").glob("*.checkpoint.parquet")), \
        "a checkpoint within the first 13 commits"
    Compaction(settings, tmp_path / "scratch", keep_applied_s=0).compact(TOPIC, ("id",), "_offset")
    assert DeltaTable(settings.uri_for(TOPIC)).metadata().configuration.get("delta.checkpointInterval") == "10"
