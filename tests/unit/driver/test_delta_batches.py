"""Which staged files a micro-batch's Delta merge applies, and how they are cut into commits (pure logic)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from sink_service.driver.delta_batches import StagedUpload, covered_uploads, merge_groups
from uploader.delta_settings import DeltaSettings
from uploader.target import FileMetadata


def _row(topic: str, partition: int, *spans: tuple[int, int], parked: int | None = None) -> SimpleNamespace:
    files = [{"parked": "delta_schema" if first == parked else None, "location": f"/s/{topic}/{partition}/{first}",
              "first_offset": first, "last_offset": last, "records": last - first + 1, "bytes": 100,
              "primary_keys": ["id"], "order_column": "_offset", "schema_fingerprint": "x"} for first, last in spans]
    return SimpleNamespace(topic=topic, partition=partition, files=json.dumps(files))


def _spans(staged: list[StagedUpload]) -> list[tuple[str, int, int]]:
    return [(s.metadata.topic, s.metadata.partition, s.metadata.first_offset) for s in staged]


def test_only_files_below_the_new_commit_position_are_merged():
    rows = [
        _row("t", 1, (200, 299)),  # a later range of partition 1, after a failed one: past its commit
        _row("t", 0, (0, 99), (100, 199)),
        _row("t", 1, (0, 99), (100, 149)),  # the range stopped at 150
        _row("t", 2, (0, 9)),  # a partition whose commit did not move
    ]
    staged = covered_uploads(rows, {("t", 0): 200, ("t", 1): 150})
    assert _spans(staged) == [("t", 0, 0), ("t", 0, 100), ("t", 1, 0), ("t", 1, 100)]
    assert staged[0].metadata.primary_keys == ("id",) and staged[0].metadata.order_column == "_offset"


def test_a_file_the_task_parked_is_not_merged():
    assert covered_uploads([_row("t", 0, (0, 9), (10, 19), parked=0)], {("t", 0): 20})[0].metadata.first_offset == 10


def _upload(topic: str, partition: int, first: int, size: int) -> StagedUpload:
    return StagedUpload(f"/s/{topic}/{partition}/{first}", FileMetadata(
        topic=topic, partition=partition, first_offset=first, last_offset=first + 9, record_count=10,
        target_table="", primary_keys=("id",), order_column="_offset", schema_fingerprint="x"), size // 10, size)


def test_commits_are_cut_by_decoded_bytes_and_keep_each_partitions_files_in_offset_order():
    settings = DeltaSettings(table_uri="/lake/{topic}", group_id="g")
    staged = [_upload("a", 0, 0, 40), _upload("a", 0, 10, 40), _upload("a", 0, 20, 40), _upload("a", 1, 0, 40),
              _upload("b", 0, 0, 10)]
    groups = merge_groups(staged, settings, max_bytes=100)
    assert [_spans(g) for g in groups] == [
        [("a", 0, 0), ("a", 1, 0)],  # in turns across partitions: a/0's first file, a/1's first file ...
        [("a", 0, 10), ("a", 0, 20)],  # ... then a/0's later files, cut where 100 Arrow bytes would be passed
        [("b", 0, 0)],  # another table ({topic}): its own commit
    ]


def test_one_table_for_every_topic_is_one_commit():
    settings = DeltaSettings(table_uri="/lake/all", group_id="g")
    groups = merge_groups([_upload("a", 0, 0, 1), _upload("b", 0, 0, 1)], settings, max_bytes=100)
    assert [_spans(g) for g in groups] == [[("a", 0, 0), ("b", 0, 0)]]


def test_the_decoded_size_comes_from_the_task_and_an_older_outcome_falls_back_to_the_file_size():
    row = _row("t", 0, (0, 9), (10, 19))
    files = json.loads(row.files)
    files[0]["decoded_bytes"] = 12345
    row.files = json.dumps(files)
    assert [s.decoded_bytes for s in covered_uploads([row], {("t", 0): 20})] == [12345, 100]
