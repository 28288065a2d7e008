"""Per-partition Parquet files: roll on record count, size and schema change; nothing lost."""

from __future__ import annotations

import os
import random
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.parquet_files import ClosedFile, PartitionFileWriter, conform, schema_fingerprint

TOPIC, PARTITION = "orders", 2


class Collector:
    def __init__(self) -> None:
        self.files: list[ClosedFile] = []

    def __call__(self, closed: ClosedFile) -> None:
        assert closed.path.exists(), "on_close must get a complete file on disk"
        self.files.append(closed)


def make_writer(tmp_path: Path, *, max_bytes=1 << 30, max_records=1_000_000, compression="snappy"):
    collector = Collector()
    writer = PartitionFileWriter(
        tmp_path / "files", TOPIC, PARTITION,
        max_bytes=max_bytes, max_records=max_records, compression=compression, on_close=collector,
    )
    return writer, collector


def chunk(first: int, count: int, **columns) -> pa.Table:
    data = {"id": list(range(first, first + count))}
    for name, values in columns.items():
        data[name] = values if isinstance(values, list) else [values] * count
    data["_offset"] = pa.array(range(first, first + count), pa.int64())
    return pa.table(data)


def random_text(rng: random.Random, n: int, length: int) -> list[str]:
    alphabet = string.ascii_letters + string.digits
    return ["".join(rng.choices(alphabet, k=length)) for _ in range(n)]


def read_back(files: list[ClosedFile]) -> list[dict]:
    rows = []
    for closed in files:
        rows += pq.read_table(closed.path).to_pylist()
    return rows


def check_files(files: list[ClosedFile], first: int, last: int) -> None:
    """Files are in order, contiguous, and their metadata matches their content."""
    expected = first
    for closed in files:
        table = pq.read_table(closed.path)
        offsets = table.column("_offset").to_pylist()
        assert offsets == list(range(closed.first_offset, closed.last_offset + 1))
        assert closed.first_offset == expected
        assert closed.record_count == table.num_rows == len(offsets)
        assert closed.size_bytes == os.path.getsize(closed.path)
        assert closed.topic == TOPIC and closed.partition == PARTITION
        expected = closed.last_offset + 1
    assert expected == last + 1


def test_files_are_capped_at_max_records(tmp_path):
    writer, collector = make_writer(tmp_path, max_records=100)
    for first in range(0, 250, 30):
        writer.append(chunk(first, min(30, 250 - first)))
    writer.finish()
    assert [f.record_count for f in collector.files] == [100, 100, 50]
    check_files(collector.files, 0, 249)


def test_one_large_append_is_cut_at_max_records(tmp_path):
    writer, collector = make_writer(tmp_path, max_records=40)
    writer.append(chunk(1000, 130))
    writer.finish()
    assert [f.record_count for f in collector.files] == [40, 40, 40, 10]
    check_files(collector.files, 1000, 1129)


def test_exactly_max_records_closes_without_waiting_for_finish(tmp_path):
    writer, collector = make_writer(tmp_path, max_records=50)
    writer.append(chunk(0, 50))
    assert [f.record_count for f in collector.files] == [50]
    writer.finish()
    assert len(collector.files) == 1


def test_finish_without_rows_writes_nothing(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.finish()
    writer.append(chunk(0, 0))
    writer.finish()
    assert collector.files == []
    assert not (tmp_path / "files").exists() or not any((tmp_path / "files").iterdir())


def _file_bound(closed: ClosedFile, max_bytes: int) -> int:
    meta = pq.ParquetFile(closed.path).metadata
    row_groups = [
        sum(meta.row_group(i).column(c).total_compressed_size for c in range(meta.num_columns))
        for i in range(meta.num_row_groups)
    ]
    footer = meta.serialized_size + 8
    return max_bytes + max(row_groups) + footer


def test_files_roll_on_size(tmp_path):
    max_bytes = 200_000
    writer, collector = make_writer(tmp_path, max_bytes=max_bytes)
    rng = random.Random(7)
    first = 0
    for _ in range(120):  # ~1.9 MB of incompressible text in small chunks
        writer.append(chunk(first, 100, text=random_text(rng, 100, 150)))
        first += 100
    writer.finish()
    assert len(collector.files) >= 5
    check_files(collector.files, 0, first - 1)
    for closed in collector.files[:-1]:
        assert closed.size_bytes >= max_bytes
    for closed in collector.files:
        assert closed.size_bytes <= _file_bound(closed, max_bytes)


def test_one_large_append_is_still_cut_near_max_bytes(tmp_path):
    # A decoded chunk can hold tens of thousands of records; one append must not become one
    # oversized row group and so one oversized file. Files are capped at the size threshold
    # plus at most one row group, and a row group holds at most about max_bytes of rows here.
    max_bytes = 256 * 1024
    writer, collector = make_writer(tmp_path, max_bytes=max_bytes)
    rng = random.Random(11)
    writer.append(chunk(0, 20_000, text=random_text(rng, 20_000, 200)))  # ~4 MB
    writer.finish()
    check_files(collector.files, 0, 19_999)
    sizes = [f.size_bytes for f in collector.files]
    assert max(sizes) <= 2 * max_bytes + 64 * 1024, sizes


def test_new_field_starts_a_new_file_and_keeps_earlier_columns(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 5, a="x"))
    writer.append(chunk(5, 5, a="y", b=1.5))
    writer.append(chunk(10, 5, a="z"))  # fits the widened schema: stays in file 2
    writer.finish()
    assert [f.record_count for f in collector.files] == [5, 10]
    check_files(collector.files, 0, 14)
    assert collector.files[0].schema_fingerprint != collector.files[1].schema_fingerprint
    second = pq.read_table(collector.files[1].path)
    assert set(second.column_names) == {"id", "a", "b", "_offset"}
    assert second.column("b").to_pylist() == [1.5] * 5 + [None] * 5


def test_int_then_whole_floats_stay_or_roll_without_losing_rows(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 3, x=[1, 2, 3]))
    writer.append(chunk(3, 2, x=[4.0, 5.0]))
    writer.finish()
    assert len(collector.files) in (1, 2)
    check_files(collector.files, 0, 4)
    assert [r["x"] for r in read_back(collector.files)] == [1, 2, 3, 4, 5]


def test_int_then_fractional_float_rolls_to_a_wider_type_without_losing_rows(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 3, x=[1, 2, 3]))
    writer.append(chunk(3, 2, x=[4.5, 5.25]))
    writer.append(chunk(5, 2, x=[6, 7]))
    writer.finish()
    check_files(collector.files, 0, 6)
    values = [r["x"] for r in read_back(collector.files)]
    assert values == [1, 2, 3, 4.5, 5.25, 6, 7]
    assert pq.read_table(collector.files[-1].path).schema.field("x").type == pa.float64()


def test_float_then_int_stays_float(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 2, x=[0.5, 1.5]))
    writer.append(chunk(2, 2, x=[2, 3]))
    writer.finish()
    assert len(collector.files) == 1
    assert [r["x"] for r in read_back(collector.files)] == [0.5, 1.5, 2.0, 3.0]


def test_incompatible_type_rolls_and_keeps_every_row(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 2, x=[1, 2]))
    writer.append(chunk(2, 2, x=[{"a": 1}, {"a": 2}]))
    writer.append(chunk(4, 2, x=[5, 6]))
    writer.finish()
    check_files(collector.files, 0, 5)
    assert [r["x"] for r in read_back(collector.files)] == [1, 2, {"a": 1}, {"a": 2}, 5, 6]


def test_text_is_not_reinterpreted_as_a_number(tmp_path):
    # A value sent as the string "00123" must reach the endpoint as that string, even when an
    # earlier chunk in the same file had numbers in that field.
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 1, zip=[12345]))
    writer.append(chunk(1, 1, zip=["00123"]))
    writer.finish()
    check_files(collector.files, 0, 1)
    assert [str(r["zip"]) for r in read_back(collector.files)] == ["12345", "00123"]


def test_all_null_column_is_written_as_string(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 2, note=[None, None]))
    writer.finish()
    table = pq.read_table(collector.files[0].path)
    assert table.schema.field("note").type == pa.string()
    assert table.column("note").to_pylist() == [None, None]


def test_schema_fingerprint_follows_the_schema():
    one = pa.schema([("a", pa.int64())])
    assert schema_fingerprint(one) == schema_fingerprint(pa.schema([("a", pa.int64())]))
    assert schema_fingerprint(one) != schema_fingerprint(pa.schema([("a", pa.float64())]))
    assert schema_fingerprint(one) != schema_fingerprint(pa.schema([("b", pa.int64())]))


@pytest.mark.parametrize("compression", ["none", "zstd", "gzip"])
def test_compression_codecs(tmp_path, compression):
    writer, collector = make_writer(tmp_path, compression=compression)
    writer.append(chunk(0, 10, a="x"))
    writer.finish()
    meta = pq.ParquetFile(collector.files[0].path).metadata
    codec = meta.row_group(0).column(0).compression
    assert codec == ("UNCOMPRESSED" if compression == "none" else compression.upper())


def test_abandon_leaves_no_file(tmp_path):
    writer, collector = make_writer(tmp_path, max_bytes=100_000)
    # More than one row group's worth of rows that compress well: a row group is written and
    # the file is open on disk, still below max_bytes.
    writer.append(chunk(0, 2000, text="a" * 100))
    directory = tmp_path / "files"
    assert collector.files == []
    assert any(directory.iterdir())
    writer.abandon()
    assert not any(directory.iterdir())
    assert collector.files == []


def test_abandon_with_only_buffered_rows(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 3))
    writer.abandon()
    directory = tmp_path / "files"
    assert not directory.exists() or not any(directory.iterdir())
    assert collector.files == []


def test_conform_fills_missing_columns_and_orders_by_schema():
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])
    table = pa.table({"c": [1, 2], "a": [3, 4]})
    result = conform(table, schema)
    assert result.schema == schema
    assert result.to_pylist() == [{"a": 3, "b": None, "c": 1.0}, {"a": 4, "b": None, "c": 2.0}]


def test_conform_rejects_unknown_columns():
    assert conform(pa.table({"a": [1], "new": [2]}), pa.schema([("a", pa.int64())])) is None


def test_conform_rejects_unsafe_casts():
    schema = pa.schema([("a", pa.int32())])
    assert conform(pa.table({"a": [1.5]}), schema) is None
    assert conform(pa.table({"a": [2**40]}), schema) is None
    assert conform(pa.table({"a": [{"x": 1}]}), schema) is None
    whole = conform(pa.table({"a": [7.0]}), schema)  # may be refused, but never altered
    assert whole is None or whole.column("a").to_pylist() == [7]


def test_conform_widens_int_to_float():
    result = conform(pa.table({"a": pa.array([1, 2], pa.int32())}), pa.schema([("a", pa.float64())]))
    assert result.column("a").to_pylist() == [1.0, 2.0]
    assert result.schema.field("a").type == pa.float64()


def test_conform_identity():
    table = pa.table({"a": [1, 2]})
    assert conform(table, table.schema).equals(table)


@pytest.mark.timeout(2)
def test_large_int_after_float_column_does_not_hang_and_keeps_its_value(tmp_path):
    # 2**53 + 1 cannot be cast to float64 safely, and the widened (permissive) schema of the two
    # chunks is float64 again: the writer must still make progress and keep the row intact.
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 1, x=[0.5]))
    writer.append(chunk(1, 1, x=[2**53 + 1]))
    writer.finish()
    check_files(collector.files, 0, 1)
    values = [r["x"] for r in read_back(collector.files)]
    assert values[0] == 0.5
    assert int(values[1]) == 2**53 + 1


@pytest.mark.parametrize("first, second", [
    ({"a": 1}, {"a": 2, "b": "new"}),
    ([{"a": 1}], [{"a": 2, "b": "new"}]),
])
def test_new_nested_field_is_not_dropped(tmp_path, first, second):
    # Schema evolution inside a struct (or a list of structs) is a schema change like a new
    # top-level field: the new nested field must reach the file.
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 1, x=[first]))
    writer.append(chunk(1, 1, x=[second]))
    writer.finish()
    check_files(collector.files, 0, 1)
    assert [r["x"] for r in read_back(collector.files)][1] == second


def test_conform_does_not_drop_nested_fields():
    schema = pa.schema([("x", pa.struct([("a", pa.int64())]))])
    table = pa.table({"x": [{"a": 1, "b": "new"}]})
    result = conform(table, schema)
    assert result is None or result.to_pylist() == [{"x": {"a": 1, "b": "new"}}]
