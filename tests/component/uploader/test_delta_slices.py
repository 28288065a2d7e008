"""A staged file larger than the merge's memory bound is merged in pieces of whole row groups, each a true
prefix of its partition, with the same end result as one merge of the whole file."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from sink_service.task.parquet_files import ClosedFile, PartitionFileWriter
from tests.component.uploader.test_delta_exact_rows import FAST, TOPIC
from uploader.delta import DeltaFile, DeltaTarget, applied_files
from uploader.delta_settings import DeltaSettings
from uploader.delta_slices import arrow_bytes, pieces, row_group_bytes
from uploader.parquet_info import ROW_GROUP_BYTES_KEY
from uploader.target import FileMetadata


def _big_file(tmp: Path, rows: int, rows_per_group: int, skip_every: int = 0) -> DeltaFile:
    """One file as the service's writer makes it for a Delta table, with small row groups."""
    closed: list[ClosedFile] = []
    writer = PartitionFileWriter(tmp / "files", TOPIC, 0, max_bytes=1 << 30, max_records=1 << 30,
                                 compression="zstd", on_close=closed.append, typed_table=True)
    offsets = [o for o in range(rows * 2) if not skip_every or o % skip_every][:rows]
    for start in range(0, rows, rows_per_group):
        chunk = offsets[start:start + rows_per_group]
        table = pa.table({"id": [o % 97 for o in chunk], "note": [f"n{o:06d}" for o in chunk], "_offset": chunk})
        writer._row_group_bytes = table.nbytes  # a row group per append (the writer's floor is 64 kB)
        writer.append(table)
    writer.finish()
    c = closed[0]
    return DeltaFile(c.path, FileMetadata(topic=TOPIC, partition=0, first_offset=c.first_offset,
                                          last_offset=c.last_offset, record_count=c.record_count, target_table=TOPIC,
                                          primary_keys=("id",), order_column="_offset",
                                          schema_fingerprint=c.schema_fingerprint))


def test_the_writer_records_each_row_groups_arrow_bytes(tmp_path: Path) -> None:
    file = _big_file(tmp_path, 1000, 100)
    metadata = pq.read_metadata(file.path)
    assert metadata.num_row_groups == 10
    assert ROW_GROUP_BYTES_KEY in metadata.metadata
    assert all(size > 0 for size in row_group_bytes(metadata))
    assert arrow_bytes(file) == sum(row_group_bytes(metadata))


def test_a_large_file_merged_in_pieces_ends_as_one_merge_of_it_and_each_piece_is_a_prefix(tmp_path: Path) -> None:
    file = _big_file(tmp_path, 1000, 100, skip_every=7)  # offsets with gaps, as transaction markers leave
    cut = pieces(file, arrow_bytes(file) // 3)
    assert len(cut) >= 3
    assert cut[0].metadata.first_offset == file.metadata.first_offset
    assert cut[-1].metadata.last_offset == file.metadata.last_offset
    for before, after in pairwise(cut):
        assert after.metadata.first_offset == before.metadata.last_offset + 1
    assert sum(p.metadata.record_count for p in cut) == 1000
    for piece in cut:
        offsets = pq.read_table(piece.path)["_offset"].to_pylist()
        assert piece.metadata.first_offset <= min(offsets) and max(offsets) <= piece.metadata.last_offset

    whole, in_pieces = str(tmp_path / "whole"), str(tmp_path / "pieces")
    DeltaTarget(DeltaSettings(table_uri=whole, group_id="g", retry=FAST)).merge([file])
    target = DeltaTarget(DeltaSettings(table_uri=in_pieces, group_id="g", retry=FAST))
    for piece in cut:
        target.merge([piece])
    assert (DeltaTable(in_pieces).to_pyarrow_table().sort_by("id").to_pylist()
            == DeltaTable(whole).to_pyarrow_table().sort_by("id").to_pylist())
    applied = [(f["first_offset"], f["last_offset"]) for c in DeltaTable(in_pieces).history() for f in applied_files(c)]
    assert sorted(applied) == [(p.metadata.first_offset, p.metadata.last_offset) for p in cut]
    assert DeltaTable(in_pieces).transaction_version("kafka-parquet-sink/g/orders/0") == file.metadata.last_offset + 1


def test_a_file_within_the_bound_or_without_ordered_row_groups_is_one_piece(tmp_path: Path) -> None:
    file = _big_file(tmp_path, 300, 100)
    assert pieces(file, arrow_bytes(file)) == [file]
    shuffled = tmp_path / "shuffled.parquet"
    table = pq.read_table(file.path)
    with pq.ParquetWriter(shuffled, table.schema) as writer:  # row groups not in offset order (compacted)
        for start in (200, 0, 100):
            writer.write_table(table.slice(start, 100), row_group_size=100)
    odd = DeltaFile(shuffled, file.metadata)
    assert pieces(odd, 1) == [odd]
