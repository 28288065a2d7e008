"""Per-partition Parquet files: roll on record count, size and schema change; nothing lost."""

from __future__ import annotations

import os
import random
import shutil
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.decode.compact import FileCompactor
from sink_service.task import parquet_files
from sink_service.task.parquet_files import ClosedFile, PartitionFileWriter, schema_fingerprint
from uploader.parquet_info import BOOKKEEPING_KEY

TOPIC, PARTITION = "orders", 2


class Collector:
    def __init__(self) -> None:
        self.files: list[ClosedFile] = []

    def __call__(self, closed: ClosedFile) -> None:
        assert closed.path.exists(), "on_close must get a complete file on disk"
        self.files.append(closed)


def make_writer(tmp_path: Path, *, max_bytes=1 << 30, max_records=1_000_000, compression="snappy", floor=None):
    collector = Collector()
    writer = PartitionFileWriter(
        tmp_path / "files", TOPIC, PARTITION,
        max_bytes=max_bytes, max_records=max_records, compression=compression, on_close=collector, floor=floor,
    )
    return writer, collector


def chunk(first: int, count: int, **columns) -> pa.Table:
    data = {"id": list(range(first, first + count))}
    for name, values in columns.items():
        data[name] = values if isinstance(values, list) else [values] * count
    data["_offset"] = pa.array(range(first, first + count), pa.int64())
    return pa.table(data)


@pytest.fixture
def small_row_groups(monkeypatch):
    """Row groups of 64 kB, so a few appends put rows on disk without filling a file."""
    monkeypatch.setattr(parquet_files, "ROW_GROUP_MAX_BYTES", 64 * 1024)


def wide_chunk(first: int, count: int, x) -> pa.Table:
    """Rows with ~100 B of text each: 1,000 of them fill a 64 kB row group."""
    return chunk(first, count, text="t" * 100, x=x)


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


def test_new_field_widens_the_buffered_rows_in_place(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 5, a="x"))
    writer.append(chunk(5, 5, a="y", b=1.5))
    writer.finish()
    [closed] = collector.files
    check_files(collector.files, 0, 9)
    assert pq.read_table(closed.path).column("b").to_pylist() == [None] * 5 + [1.5] * 5


def test_new_field_after_a_written_row_group_starts_a_new_file_and_keeps_earlier_columns(tmp_path, small_row_groups):
    writer, collector = make_writer(tmp_path)
    writer.append(wide_chunk(0, 1000, x="x"))
    writer.append(wide_chunk(1000, 5, x="y").append_column("b", pa.array([1.5] * 5)))
    writer.append(wide_chunk(1005, 5, x="z"))  # fits the widened schema: stays in file 2
    writer.finish()
    assert [f.record_count for f in collector.files] == [1000, 10]
    check_files(collector.files, 0, 1009)
    assert collector.files[0].schema_fingerprint != collector.files[1].schema_fingerprint
    second = pq.read_table(collector.files[1].path)
    assert set(second.column_names) == {"id", "text", "x", "_offset", "b"}
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


def test_incompatible_types_join_to_text_and_keep_every_row(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 2, x=[1, 2]))
    writer.append(chunk(2, 2, x=[{"a": 1}, {"a": 2}]))
    writer.append(chunk(4, 2, x=[5, 6]))
    writer.finish()
    check_files(collector.files, 0, 5)
    assert [r["x"] for r in read_back(collector.files)] == ["1", "2", '{"a":1}', '{"a":2}', "5", "6"]


def test_text_is_not_reinterpreted_as_a_number(tmp_path):
    # A value sent as the string "00123" must reach the endpoint as that string, even when an
    # earlier chunk in the same file had numbers in that field.
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 1, zip=[12345]))
    writer.append(chunk(1, 1, zip=["00123"]))
    writer.finish()
    check_files(collector.files, 0, 1)
    assert [str(r["zip"]) for r in read_back(collector.files)] == ["12345", "00123"]


def test_an_all_null_column_is_left_out_until_it_has_a_value(tmp_path):
    """Written as string, it would change type between files once a number arrives."""
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 2, note=[None, None]))
    writer.finish()
    writer.append(chunk(2, 2, note=[None, 7]))
    writer.finish()
    first, second = (pq.read_table(f.path) for f in collector.files)
    assert "note" not in first.schema.names and first.num_rows == 2
    assert second.schema.field("note").type == pa.int64()
    assert second.column("note").to_pylist() == [None, 7]


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


def test_a_scratch_directory_removed_between_files_is_made_again(tmp_path):
    # The directory is made when opening a file finds it missing, not checked before every file.
    writer, collector = make_writer(tmp_path, max_records=10)
    writer.append(chunk(0, 10))
    shutil.rmtree(tmp_path / "files")
    writer.append(chunk(10, 10))
    assert [f.path.exists() for f in collector.files] == [False, True]
    check_files(collector.files[1:], 10, 19)


def test_a_file_rewritten_by_compaction_reports_its_rewritten_size(tmp_path, small_row_groups):
    # The size is the writer's position unless compaction rewrote the closed file.
    collector = Collector()
    writer = PartitionFileWriter(
        tmp_path / "files", TOPIC, PARTITION, max_bytes=1 << 30, max_records=1_000_000, compression="snappy",
        on_close=collector, compactor=lambda: FileCompactor(("id",), "_offset"),
    )
    for first in range(0, 6000, 1000):  # ids repeat in every chunk: each row group overrides the last
        table = chunk(first, 1000, text=random_text(random.Random(first), 1000, 100))
        writer.append(table.set_column(0, "id", pa.array([i % 1000 for i in range(1000)])))
    writer.finish()
    (closed,) = collector.files
    assert closed.record_count == pq.read_metadata(closed.path).num_rows == 1000
    assert closed.size_bytes == os.path.getsize(closed.path)


def test_abandon_with_only_buffered_rows(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 3))
    writer.abandon()
    directory = tmp_path / "files"
    assert not directory.exists() or not any(directory.iterdir())
    assert collector.files == []


@pytest.mark.timeout(2)
def test_large_int_after_float_column_does_not_hang_and_keeps_its_value(tmp_path):
    # 2**53 + 1 cannot be cast to float64 safely, though float64 is the join of the two chunks'
    # types: the writer must still make progress and keep the row intact.
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 1, x=[0.5]))
    writer.append(chunk(1, 1, x=[2**53 + 1]))
    writer.finish()
    check_files(collector.files, 0, 1)
    values = [r["x"] for r in read_back(collector.files)]
    assert values == ["0.5", str(2**53 + 1)]  # no double holds 2**53 + 1: the column is text


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


# --- One type per column, widened by the lattice (issue 9) ---------------------------------




def test_field_that_flips_type_between_written_row_groups_gives_two_files(tmp_path, small_row_groups):
    writer, collector = make_writer(tmp_path)
    expected = []
    for i in range(40):
        first = i * 1000
        values = list(range(first, first + 1000)) if i % 2 == 0 else [f"s{n}" for n in range(first, first + 1000)]
        writer.append(wide_chunk(first, 1000, values))
        expected += values
    writer.finish()
    check_files(collector.files, 0, 39_999)
    assert len(collector.files) == 2  # int64, then string from the first string chunk on
    assert [r["x"] for r in read_back(collector.files)] == expected[:1000] + [str(v) for v in expected[1000:]]
    assert pq.read_table(collector.files[1].path).schema.field("x").type == pa.string()
    assert writer.written_schema.field("x").type == pa.string()


def test_type_change_before_any_row_group_is_written_stays_in_one_file(tmp_path):
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 2, x=[1, 2]))
    writer.append(chunk(2, 2, x=["a", "b"]))
    writer.append(chunk(4, 2, x=[{"k": 1}, None]))
    writer.finish()
    assert len(collector.files) == 1
    assert [r["x"] for r in read_back(collector.files)] == ["1", "2", "a", "b", '{"k":1}', None]


def test_floor_casts_narrower_chunks_up_and_adds_no_columns(tmp_path):
    floor = pa.schema([("x", pa.string()), ("y", pa.float64()), ("absent", pa.int64())])
    writer, collector = make_writer(tmp_path, floor=floor)
    writer.append(chunk(0, 2, x=[1, 2], y=[3, 4]))
    writer.finish()
    [closed] = collector.files
    table = pq.read_table(closed.path)
    assert table.column_names == ["id", "x", "y", "_offset"]
    assert table.schema.field("x").type == pa.string() and table.schema.field("y").type == pa.float64()
    assert table.column("x").to_pylist() == ["1", "2"] and table.column("y").to_pylist() == [3.0, 4.0]
    assert writer.written_schema == pa.schema([("id", pa.int64()), ("x", pa.string()), ("y", pa.float64()),
                                               ("_offset", pa.int64())])


def test_written_schema_is_the_widest_type_written(tmp_path):
    writer, collector = make_writer(tmp_path, max_records=2)
    assert writer.written_schema is None
    writer.append(chunk(0, 2, x=[1, 2]))
    writer.append(chunk(2, 2, x=[0.5, 1.5]))
    writer.append(chunk(4, 2, x=[5, 6]))  # cast up to what was written before: no narrower file
    writer.finish()
    assert [pq.read_table(f.path).schema.field("x").type for f in collector.files] == [pa.int64(), pa.float64(),
                                                                                     pa.float64()]
    assert writer.written_schema.field("x").type == pa.float64()


def test_empty_objects_and_arrays_from_decode_are_written(tmp_path):
    from sink_service.decode import RAW_SCHEMA, DecodeSpec, decode
    values = [b'{"order_id": 1, "meta": {}}', b'{"order_id": 2, "tags": [], "objs": [{}], "s": {"e": {}}}']
    raw = pa.RecordBatch.from_pylist(
        [{"topic": TOPIC, "partition": PARTITION, "offset": i, "timestamp_ms": 0, "key": None, "value": v}
         for i, v in enumerate(values)], schema=RAW_SCHEMA)
    decoded = decode(raw, DecodeSpec(None, ("order_id",), "_offset"))
    writer, collector = make_writer(tmp_path)
    for segment in decoded.segments:
        writer.append(segment)
    writer.finish()
    rows = read_back(collector.files)
    assert [r["order_id"] for r in rows] == [1, 2]
    assert [r["tags"] for r in rows] == [None, []]
    assert [r["objs"] for r in rows] == [None, [None]]


def test_awkward_json_is_decoded_written_and_read_back_exactly(tmp_path):
    from sink_service.decode import RAW_SCHEMA, DecodeSpec, decode
    blob = "b" * 300_000
    records = [  # (value, what the row holds once read back; None: a bad record)
        (b'{"id": 1, "meta": {}, "x": 1}', {"x": "1"}),
        (b'{"id": 2, "tags": [], "x": "one"}', {"tags": [], "x": "one"}),
        (b'{"id": 3, "big": 12345678901234567890, "at": "2024-01-02T10:00:00+02:00"}',
         {"big": 12345678901234567890, "at": "2024-01-02T10:00:00+02:00"}),
        (None, None),  # tombstone
        (b'{"id": 5, "blob": "%s", "x": {"a": 1}}' % blob.encode(), {"blob": blob, "x": '{"a":1}'}),
        (b'{"id": 6, "s": "caf\xe9"}', None),  # not UTF-8
        (b'{"id": 7, "items": [{"sku": "a", "qty": 1}, {"sku": "b"}], "at": "2024-01-02T10:00:00.123Z"}',
         {"items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": None}], "at": "2024-01-02T10:00:00.123Z"}),
        (b'{"id": 8, "s": "two\nlines"}', None),  # a raw newline inside a string
        (b'{\n  "id": 9,\n  "big": 98765432109876543210,\n  "x": 2.5\n}', {"big": 98765432109876543210, "x": "2.5"}),
        (b'{"id": 10, "meta": {"k": "v"}, "tags": ["t"], "x": true}', {"meta": {"k": "v"}, "tags": ["t"], "x": "true"}),
        (b'{"id": 11, "x": 3, "big": 4}', {"x": "3", "big": 4}),
        (b"not json", None),
    ]
    raw = pa.RecordBatch.from_pylist(
        [{"topic": TOPIC, "partition": PARTITION, "offset": 100 + i, "timestamp_ms": 0, "key": None, "value": v}
         for i, (v, _) in enumerate(records)], schema=RAW_SCHEMA)
    writer, collector = make_writer(tmp_path)
    bad = []
    for start in range(0, raw.num_rows, 3):  # several chunks, so the writer widens across them
        decoded = decode(raw.slice(start, 3), DecodeSpec(None, ("id",), "_offset", tombstones="fail"))
        bad += decoded.bad_records
        for segment in decoded.segments:
            writer.append(segment)
    writer.finish()
    assert [(b.topic, b.partition, b.offset) for b in bad] == [
        (TOPIC, PARTITION, 100 + i) for i, (_, row) in enumerate(records) if row is None]
    assert len(collector.files) <= 3
    got = {r["_offset"]: r for r in read_back(collector.files)}
    expected = {100 + i: row for i, (_, row) in enumerate(records) if row is not None}
    assert sorted(got) == sorted(expected)
    for offset, row in expected.items():
        assert got[offset]["id"] == offset - 99
        for name, value in row.items():
            read = got[offset][name]
            assert (int(read) if name == "big" else read) == value, (offset, name)


@pytest.mark.timeout(20)
def test_an_object_naming_its_fields_in_another_order_fits_the_open_file(tmp_path):
    """JSON objects name fields in any order: a struct of the open file's fields in another order (and one
    new) once made the writer's fitting loop spin forever, holding the task."""
    writer, collector = make_writer(tmp_path)
    writer.append(chunk(0, 2, customer=[{"name": "a", "tier": 1}, {"name": "b", "tier": 2}]))
    writer.append(chunk(2, 1, customer=[{"tier": 3, "email": "e", "name": "c"}]))
    writer.finish()
    check_files(collector.files, 0, 2)
    assert [r["customer"] for r in read_back(collector.files)] == [
        {"name": "a", "tier": 1, "email": None}, {"name": "b", "tier": 2, "email": None},
        {"name": "c", "tier": 3, "email": "e"}]


def test_for_a_typed_table_files_keep_their_own_types_and_carry_the_offset_for_bookkeeping(tmp_path):
    """A Delta table fits each file to its own types; a file it refuses must not raise later files' types,
    and `_offset` travels as named bookkeeping even where SINK_METADATA_COLUMNS leaves it out."""
    collector = Collector()
    writer = PartitionFileWriter(tmp_path / "files", TOPIC, PARTITION, max_bytes=1 << 30, max_records=1,
                                 compression="snappy", on_close=collector, floor=pa.schema([("amount", pa.string())]),
                                 unstored=("_offset",), bookkeeping=("_offset",), typed_table=True)
    writer.append(chunk(0, 1, amount="n/a"))
    writer.append(chunk(1, 2, amount=7))
    writer.finish()
    schemas = [pq.read_schema(f.path) for f in collector.files]
    assert [s.field("amount").type for s in schemas] == [pa.string(), pa.int64(), pa.int64()]
    assert all(s.metadata[BOOKKEEPING_KEY] == b"_offset" for s in schemas)
    assert read_back(collector.files)[1] == {"id": 1, "amount": 7, "_offset": 1}
