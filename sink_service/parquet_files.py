"""Per-partition Parquet files that roll on size, record count and schema change.

Rows are buffered only up to one row group, so memory stays bounded whatever the range size.
A file is closed once its encoded size reaches the byte threshold, so files are capped at that
threshold plus at most one row group.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from uploader.parquet_info import schema_fingerprint

ROW_GROUP_MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ClosedFile:
    path: Path
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    record_count: int
    size_bytes: int
    schema_fingerprint: str


def _file_schema(schema: pa.Schema) -> pa.Schema:
    """Columns that were null in every row so far are typed as strings, the most general type."""
    return pa.schema([
        f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in schema
    ])


def _widens(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether every value of `source` has a lossless home in `target`.

    Arrow would happily cast a struct to one with fewer fields, dropping data; only widening
    casts are allowed here, anything else starts a new file.
    """
    if source == target or pa.types.is_null(source):
        return True
    if pa.types.is_integer(source):
        return pa.types.is_floating(target) or (
            pa.types.is_integer(target)
            and pa.types.is_signed_integer(source) == pa.types.is_signed_integer(target)
            and target.bit_width >= source.bit_width
        )
    if pa.types.is_floating(source):
        return pa.types.is_floating(target) and target.bit_width >= source.bit_width
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        fields = {f.name: f.type for f in target}
        return all(f.name in fields and _widens(f.type, fields[f.name]) for f in source)
    if pa.types.is_list(source) and pa.types.is_list(target):
        return _widens(source.value_type, target.value_type)
    return False


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table | None:
    """Cast `table` to `schema` (missing columns become null); None when it cannot be done safely."""
    if any(name not in schema.names for name in table.column_names):
        return None
    columns = []
    for target in schema:
        if target.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, target.type))
            continue
        column = table.column(target.name)
        if column.type != target.type:
            if not _widens(column.type, target.type):
                return None
            try:
                column = column.cast(target.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def _merged_schema(current: pa.Schema, incoming: pa.Schema) -> pa.Schema:
    """The schema of the next file: keep earlier columns so later chunks still fit it."""
    try:
        return _file_schema(pa.unify_schemas([current, incoming], promote_options="permissive"))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return _file_schema(incoming)


class PartitionFileWriter:
    """Writes one topic-partition's rows, in offset order, into a sequence of Parquet files."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        *,
        max_bytes: int,
        max_records: int,
        compression: str,
        on_close: Callable[[ClosedFile], None],
    ):
        self._directory = directory
        self._topic = topic
        self._partition = partition
        self._max_bytes = max_bytes
        self._max_records = max_records
        self._compression = None if compression == "none" else compression
        self._on_close = on_close
        self._row_group_bytes = max(64 * 1024, min(max_bytes, ROW_GROUP_MAX_BYTES))
        self._schema: pa.Schema | None = None
        self._writer: pq.ParquetWriter | None = None
        self._path: Path | None = None
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._file_rows = 0
        self._first_offset: int | None = None
        self._last_offset: int | None = None

    def append(self, table: pa.Table) -> None:
        """Append rows (offset order); a table whose schema does not fit starts a new file."""
        while table.num_rows:
            if self._schema is None:
                self._schema = _file_schema(table.schema)
            fitted = conform(table, self._schema)
            if fitted is None:
                self._close_file()
                merged = _merged_schema(self._schema, table.schema)
                # The merged schema must accept these rows; if not, they define the next file.
                self._schema = merged if conform(table, merged) is not None else _file_schema(table.schema)
                continue
            room = self._max_records - self._file_rows - self._buffered_rows
            # Never more than one row group's bytes at a time, so a huge chunk still rolls on size.
            bytes_per_row = max(1, fitted.nbytes // max(1, fitted.num_rows))
            room = min(room, max(1, (self._row_group_bytes - self._buffered_bytes) // bytes_per_row))
            head, table = fitted.slice(0, room), fitted.slice(room)
            self._buffer.append(head)
            self._buffered_rows += head.num_rows
            self._buffered_bytes += head.nbytes
            if self._buffered_bytes >= self._row_group_bytes or table.num_rows:
                self._write_row_group()
            if self._file_rows + self._buffered_rows >= self._max_records:
                self._close_file()

    def finish(self) -> None:
        self._close_file()

    def abandon(self) -> None:
        """Drop the open file after a failure; nothing half-written is ever uploaded."""
        if self._writer is not None:
            self._writer.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._writer = None
        self._path = None
        self._buffer.clear()
        self._buffered_rows = self._buffered_bytes = self._file_rows = 0

    def _write_row_group(self) -> None:
        if not self._buffered_rows:
            return
        rows = pa.concat_tables(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
        self._buffer, self._buffered_rows, self._buffered_bytes = [], 0, 0
        if self._writer is None:
            self._directory.mkdir(parents=True, exist_ok=True)
            self._path = self._directory / f"{self._topic}-{self._partition}-{uuid.uuid4().hex}.parquet"
            self._writer = pq.ParquetWriter(self._path, self._schema, compression=self._compression)
            self._first_offset = rows.column("_offset")[0].as_py()
        self._writer.write_table(rows, row_group_size=rows.num_rows)
        self._file_rows += rows.num_rows
        self._last_offset = rows.column("_offset")[-1].as_py()
        if os.path.getsize(self._path) >= self._max_bytes:
            self._close_file()

    def _close_file(self) -> None:
        self._write_row_group()
        if self._writer is None:
            return
        self._writer.close()
        closed = ClosedFile(
            path=self._path,
            topic=self._topic,
            partition=self._partition,
            first_offset=self._first_offset,
            last_offset=self._last_offset,
            record_count=self._file_rows,
            size_bytes=os.path.getsize(self._path),
            schema_fingerprint=schema_fingerprint(self._schema),
        )
        self._writer, self._path, self._file_rows = None, None, 0
        self._on_close(closed)
