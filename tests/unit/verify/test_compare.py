"""The comparison alone, on hand-made Parquet files: each kind of difference, soft deletes, the upsert
order among target files, and target files past the committed offsets."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.verify.compare import Comparer
from sink_service.verify.expected import PARTITION_COLUMN, TOPIC_COLUMN
from sink_service.verify.report import Report
from sink_service.verify.target import TargetFile, directory_files, export_files


def expected_file(path: Path, rows: list[dict]) -> Path:
    table = pa.Table.from_pylist(rows)
    n = table.num_rows
    table = table.append_column(TOPIC_COLUMN, pa.array(["t"] * n)).append_column(
        PARTITION_COLUMN, pa.array([0] * n, pa.int32()))
    pq.write_table(table, path)
    return path


def target_file(path: Path, rows: list[dict], first: int = 0) -> TargetFile:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return TargetFile(path, "t", 0, first, where=path.name)


@pytest.fixture
def comparer(tmp_path: Path):
    c = Comparer(tmp_path / "db", memory_limit="256MB")
    yield c
    c.close()


def row(key: str, offset: int, amount: float, **extra) -> dict:
    return {"id": key, "amount": amount, "_offset": offset, **extra}


def test_each_kind_of_difference_is_counted_with_its_origin(tmp_path, comparer):
    expected = expected_file(tmp_path / "e.parquet", [
        row("equal", 0, 1.0), row("missing", 1, 1.0), row("stale", 2, 1.0), row("stale", 5, 2.0),
        row("differing", 6, 1.0), row("ahead", 7, 1.0), row("invented", 4, 1.0)])
    target = [target_file(tmp_path / "t.parquet", [
        row("equal", 0, 1.0), row("stale", 2, 1.0), row("differing", 6, 9.0), row("ahead", 8, 1.0),
        row("extra", 3, 1.0), row("invented", 9, 1.0)])]
    beyond = expected_file(tmp_path / "b.parquet", [row("ahead", 8, 1.0)])  # past the committed offsets
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5, beyond=[beyond])
    assert result.counts == {"equal": 1, "missing": 1, "stale": 1, "extra": 1, "differing": 1, "ahead": 1,
                             "invented": 1}
    assert not result.equal
    assert result.examples["stale"] == [{"key": {"id": "stale"}, "expected_order": "5", "target_order": "2",
                                         "topic": "t", "partition": 0, "offset": 5, "target_file": "t.parquet",
                                         "target_offset": 2}]
    assert result.examples["missing"][0]["offset"] == 1
    assert result.examples["extra"][0]["key"] == {"id": "extra"}


def test_the_target_resolves_as_an_upsert_engine_would(tmp_path, comparer):
    """The highest order value wins whatever the file order; on a tie the later file wins."""
    expected = expected_file(tmp_path / "e.parquet", [row("a", 5, 2.0), row("b", 3, 7.0)])
    target = [
        target_file(tmp_path / "late.parquet", [row("a", 1, 1.0), row("b", 3, 7.0)], first=10),
        target_file(tmp_path / "early.parquet", [row("a", 5, 2.0), row("b", 3, 0.0)], first=0),
    ]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5)
    assert result.counts["equal"] == 2, result.examples


def test_a_soft_deleted_key_may_be_absent_or_held_as_deleted(tmp_path, comparer):
    expected = expected_file(tmp_path / "e.parquet", [
        row("gone", 4, None, _deleted=True), row("kept", 5, None, _deleted=True), row("old", 6, None, _deleted=True)])
    target = [target_file(tmp_path / "t.parquet", [
        row("kept", 5, None, _deleted=True), row("old", 2, 3.0, _deleted=False)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5)
    assert (result.counts["equal"], result.counts["stale"], result.deleted_keys) == (2, 1, 3)


def test_target_columns_stored_differently_compare_by_value(tmp_path, comparer):
    """local_ems stores timestamps as ISO text and a column may hold ints where the topic has doubles."""
    ts = pa.array([1_700_000_000_123], pa.timestamp("ms", tz="UTC"))
    e = pa.table({"id": ["a"], "amount": [2.0], "_timestamp": ts, "_offset": pa.array([1], pa.int64()),
                  TOPIC_COLUMN: ["t"], PARTITION_COLUMN: pa.array([0], pa.int32())})
    pq.write_table(e, tmp_path / "e.parquet")
    pq.write_table(pa.table({"id": ["a"], "amount": [2], "_timestamp": ["2023-11-14T22:13:20.123Z"],
                             "_offset": [1]}), tmp_path / "t.parquet")
    result = comparer.compare("t", [tmp_path / "e.parquet"], [TargetFile(tmp_path / "t.parquet")], ("id",),
                              "_offset", examples=5)
    assert result.counts["equal"] == 1, result.examples


def test_an_empty_topic_side_makes_every_target_key_extra(tmp_path, comparer):
    target = [target_file(tmp_path / "t.parquet", [row("a", 1, 1.0)])]
    result = comparer.compare("t", [], target, ("id",), "_offset", examples=5)
    assert result.counts["extra"] == 1


def test_directory_files_leave_out_what_is_past_the_committed_offsets(tmp_path):
    for partition, first, last in ((0, 0, 9), (0, 10, 19), (1, 0, 4), (2, 0, 3)):
        folder = tmp_path / "orders" / str(partition)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{first:020d}-{last:020d}.parquet").write_bytes(b"")
    (tmp_path / "orders" / "0" / ".x.parquet.tmp-abc").write_bytes(b"")  # a writer's temporary file
    found = directory_files(tmp_path, ["orders"], {("orders", 0): 10, ("orders", 1): 5})
    assert [(f.partition, f.first_offset) for f in found.files] == [(0, 0), (1, 0)]
    assert found.uncommitted_files == 2  # 0: 10-19 and partition 2, which has no commit


def test_an_export_must_hold_parquet_files(tmp_path):
    from sink_service.verify.target import TargetUnreadable

    with pytest.raises(TargetUnreadable, match=r"no \.parquet files"):
        export_files(tmp_path)
    with pytest.raises(TargetUnreadable, match="no such file"):
        export_files(tmp_path / "absent")


def test_the_text_report_names_the_verdict_and_examples(tmp_path, comparer):
    expected = expected_file(tmp_path / "e.parquet", [row("a", 1, 1.0)])
    result = comparer.compare("orders", [expected], [], ("id",), "_offset", examples=5)
    report = Report("g", "dir /out", "_offset", ("id",), tables=[result])
    text = report.to_text()
    assert "keys checked 1, equal 0, missing 1" in text
    assert 'key {"id":"a"}; topic t partition 0 offset 1' in text
    assert text.endswith("result: NOT EQUAL: 1 missing")
    assert report.as_dict()["missing"] == 1 and report.as_dict()["equal"] is False
