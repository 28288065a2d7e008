"""A staged file too large for one merge, cut into files of whole row groups by offset.

The driver's merge holds a multiple of the rows it merges (bench.delta_merge_memory: ~4x their Arrow bytes,
delta-rs's copy included), so SINK_DELTA_MERGE_MAX_BYTES bounds the Arrow bytes of one merge, and a file
larger than that is merged in pieces, each written as a file of its own beside it (so a piece the table
refuses is parked with its own rows and name). A piece is a run of whole row groups; it covers a contiguous range of
the partition's offsets, from its first row group's first offset to the next piece's first offset - 1, so
each piece's commit records a true prefix of the partition (its application transaction). That needs row
groups in offset order with disjoint `_offset` ranges, as the service's writer makes them; any other file
(compacted, written by hand, without statistics) is one piece.

Row group sizes come from the writer's key-value metadata (their Arrow bytes); without it, from the footer's
uncompressed sizes.
"""

from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq

from uploader.delta import OFFSET, DeltaFile
from uploader.parquet_info import ROW_GROUP_BYTES_KEY


def arrow_bytes(file: DeltaFile) -> int:
    """What reading `file` holds in memory, from its footer alone."""
    return sum(row_group_bytes(pq.read_metadata(file.path)))


def row_group_bytes(metadata: pq.FileMetaData) -> list[int]:
    """Each row group's Arrow bytes, as the writer recorded them, else its uncompressed Parquet bytes."""
    recorded = (metadata.metadata or {}).get(ROW_GROUP_BYTES_KEY, b"").decode()
    sizes = [int(n) for n in recorded.split(",") if n]
    if len(sizes) == metadata.num_row_groups:
        return sizes
    return [metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)]


def pieces(file: DeltaFile, max_bytes: int) -> list[DeltaFile]:
    """`file` as files of at most `max_bytes` Arrow bytes each (one row group may pass it alone), written
    beside it one row group at a time; `file` itself when it fits or cannot be cut."""
    source = pq.ParquetFile(file.path)
    metadata = source.metadata
    sizes = row_group_bytes(metadata)
    starts = _offset_starts(metadata) if metadata.num_row_groups > 1 and sum(sizes) > max_bytes else None
    if starts is None:
        return [file]
    runs: list[list[int]] = [[]]
    size = 0
    for group, group_size in enumerate(sizes):
        if runs[-1] and size + group_size > max_bytes:
            runs.append([])
            size = 0
        runs[-1].append(group)
        size += group_size
    m = file.metadata
    schema = source.schema_arrow  # its metadata names the bookkeeping columns
    schema = schema.with_metadata({k: v for k, v in (schema.metadata or {}).items() if k != ROW_GROUP_BYTES_KEY})
    out = []
    for n, run in enumerate(runs):
        first = m.first_offset if n == 0 else starts[run[0]]
        last = m.last_offset if n == len(runs) - 1 else starts[runs[n + 1][0]] - 1
        path = file.path.with_name(f"{file.path.stem}.{first}-{last}.parquet")
        with pq.ParquetWriter(path, schema, compression=_compression(metadata)) as writer:
            for group in run:
                writer.write_table(source.read_row_group(group), row_group_size=metadata.row_group(group).num_rows)
            writer.add_key_value_metadata({ROW_GROUP_BYTES_KEY: ",".join(str(sizes[g]) for g in run)})
        out.append(DeltaFile(path, dataclasses.replace(
            m, first_offset=first, last_offset=last,
            record_count=sum(metadata.row_group(g).num_rows for g in run))))
    return out


def _compression(metadata: pq.FileMetaData) -> str:
    name = metadata.row_group(0).column(0).compression if metadata.num_columns else "UNCOMPRESSED"
    return "none" if name == "UNCOMPRESSED" else name.lower()


def _offset_starts(metadata: pq.FileMetaData) -> list[int] | None:
    """Each row group's first offset when the row groups hold increasing, disjoint offset ranges; else None."""
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    if OFFSET not in names:
        return None
    column = names.index(OFFSET)
    starts, previous_max = [], None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max:
            return None
        if previous_max is not None and stats.min <= previous_max:
            return None
        starts.append(stats.min)
        previous_max = stats.max
    return starts
