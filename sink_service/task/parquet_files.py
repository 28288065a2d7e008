"""Per-partition Parquet files that roll on size, record count and type widening.

Rows are buffered only up to one row group, so memory stays bounded whatever the range size.
A file is closed once its encoded size reaches the byte threshold, so files are capped at that
threshold plus at most one row group.

Column types follow the widening lattice of `uploader.column_types`:
- Each chunk is conformed to the open file's schema. A chunk that needs a wider type (a new
  field, or the join of two types) widens the rows still buffered in place; once a row group
  with the narrower type is on disk, that file is closed and the next starts with the wider
  type. Chunks of a narrower type are then cast up, so a flipping field costs one extra file
  per lattice step, not one per flip.
- `floor` (the widest types already written for the topic elsewhere) and the types this
  writer has written raise every later chunk's columns to at least those types, so a column
  never narrows again between files. The floor adds no columns.
- A column that has held only nulls has the lattice type null and is left out of the file
  until a value arrives; a list element or struct field that has held only nulls is stored as
  string (endpoints want a concrete type). That nested case is the one where a stored type can
  change between files, and the earlier files hold only nulls there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sink_service.decode.compact import FileCompactor
from uploader.column_types import conform, join, join_schemas, unify
from uploader.parquet_info import BOOKKEEPING_KEY, ROW_GROUP_BYTES_KEY, schema_fingerprint

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
    decoded_bytes: int = 0  # the Arrow bytes of its rows as written: what reading it back holds


def _stored(type_: pa.DataType) -> pa.DataType:
    """The type a column is written with: null (no value seen yet) is stored as string."""
    if pa.types.is_null(type_):
        return pa.string()
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(_stored(f.type)) for f in type_])
    if pa.types.is_list(type_):
        return pa.list_(type_.value_field.with_type(_stored(type_.value_type)))
    return type_


def _stored_schema(schema: pa.Schema, unstored: frozenset[str], bookkeeping: tuple[str, ...] = ()) -> pa.Schema:
    """A column that holds only nulls so far is left out: it carries no value, and writing it as
    string would change its stored type once a value arrives (an upsert of a row without the
    column sets it null, as writing the nulls would). So are the `unstored` ones."""
    stored = pa.schema([f.with_type(_stored(f.type)) for f in schema
                        if not pa.types.is_null(f.type) and f.name not in unstored])
    kept = [c for c in bookkeeping if c in stored.names]
    return stored.with_metadata({BOOKKEEPING_KEY: ",".join(kept).encode()}) if kept else stored


class PartitionFileWriter:
    """Writes one topic-partition's rows, in offset order, into a sequence of Parquet files.

    `floor`: the widest types already written for this topic elsewhere (e.g. the join of other
    writers' `written_schema`); a chunk's column typed narrower than its floor is cast up to it.
    `unstored`: columns the rows carry for bookkeeping that files leave out (`_offset`, which
    bounds files, when SINK_METADATA_COLUMNS does not write it).
    `bookkeeping`: such columns written anyway and named in the file's metadata, for a target
    that uses and drops them; `typed_table`: the target fits files to its table's types itself,
    so the floor and earlier files do not raise a file's types.
    `compactor`: makes each new file's `FileCompactor` (SINK_COMPACT_FILES), or None to keep every
    row. A file then holds the latest row per key of the records it covers; the record cap
    (`max_records`) still counts records, so a file covers the same offsets either way.
    """

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
        floor: pa.Schema | None = None,
        unstored: tuple[str, ...] = (),
        bookkeeping: tuple[str, ...] = (),
        typed_table: bool = False,
        compactor: Callable[[], FileCompactor | None] | None = None,
    ):
        self._directory = directory
        self._topic = topic
        self._partition = partition
        self._max_bytes = max_bytes
        self._max_records = max_records
        self._compression = None if compression == "none" else compression
        self._on_close = on_close
        self._floor = None if typed_table else floor
        self._raise_by_written = not typed_table
        self._unstored = frozenset(unstored) - set(bookkeeping)
        self._bookkeeping = tuple(bookkeeping)
        self._new_compactor = compactor
        self._compactor: FileCompactor | None = None  # the open file's
        self._row_group_bytes = max(64 * 1024, min(max_bytes, ROW_GROUP_MAX_BYTES))
        self._schema: pa.Schema | None = None  # lattice types of the open file (or of the buffered rows)
        self._written: pa.Schema | None = None
        self._writer: pq.ParquetWriter | None = None
        self._sink: pa.NativeFile | None = None  # the open file's: its position is the file's size
        self._path: Path | None = None
        self._stored: tuple[pa.Schema, pa.Schema, str] | None = None  # lattice schema, stored schema, fingerprint
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._file_rows = 0
        self._row_group_sizes: list[int] = []  # Arrow bytes of the open file's row groups
        self._first_offset: int | None = None
        self._last_offset: int | None = None

    @property
    def written_schema(self) -> pa.Schema | None:
        """The join of the schemas of every file handed to `on_close` so far; None before the first.

        Types are lattice types: a column that held only nulls is null here, though stored as
        string. Joined over a topic's writers (`column_types.join_schemas`), it is the next floor.
        """
        return self._written

    def append(self, table: pa.Table) -> None:
        """Append rows (offset order); a table needing wider types than rows on disk starts a new file."""
        while table.num_rows:
            fitted = self._fit(table)
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
        if self._sink is not None:
            self._sink.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._writer = None
        self._sink = None
        self._path = None
        self._schema = None  # the dropped rows are read again and bring their types back
        self._compactor = None
        self._buffer.clear()
        self._buffered_rows = self._buffered_bytes = self._file_rows = 0

    def _fit(self, table: pa.Table) -> pa.Table:
        """`table` under the open file's schema, widening that schema (and maybe rolling) first."""
        wanted = self._raised(table.schema)
        schema = wanted if self._schema is None else join_schemas(self._schema, wanted)
        while True:
            if schema != self._schema:
                self._widen(schema)
            # A chunk already of the file's types (the usual case) needs no conversion.
            fitted = table if table.schema == self._schema else conform(table, self._schema)
            if fitted.schema == self._schema:
                return fitted
            schema = join_schemas(self._schema, fitted.schema)  # a value needed more than the join

    def _raised(self, schema: pa.Schema) -> pa.Schema:
        """`schema`'s columns, each at least as wide as the floor and what was written before."""
        fields = []
        for field in schema:
            type_ = field.type
            for known in (self._floor, self._written if self._raise_by_written else None):
                index = -1 if known is None else known.get_field_index(field.name)
                if index >= 0:
                    type_ = join(known.field(index).type, type_)
            fields.append(field.with_type(type_))
        return pa.schema(fields)

    def _widen(self, schema: pa.Schema) -> None:
        if self._writer is not None:  # rows of the narrower types are on disk: they keep their file
            self._close_file()
            self._schema = schema
            return
        self._buffer = unify(self._buffer, schema) if self._buffer else []
        self._schema = self._buffer[0].schema if self._buffer else schema
        self._buffered_bytes = sum(t.nbytes for t in self._buffer)

    def _write_row_group(self) -> None:
        if not self._buffered_rows:
            return
        rows = pa.concat_tables(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
        self._buffer, self._buffered_rows, self._buffered_bytes = [], 0, 0
        stored, _ = self._file_schema()
        if self._writer is None:
            self._open(stored)
            self._first_offset = rows.column("_offset")[0].as_py()
            self._compactor = self._new_compactor() if self._new_compactor else None
        self._last_offset = rows.column("_offset")[-1].as_py()
        self._file_rows += rows.num_rows
        if self._compactor is not None:
            rows = self._compactor.row_group(rows)
        if stored.names != rows.schema.names:
            rows = rows.select(stored.names)
        if stored != rows.schema:  # metadata aside: the writer takes the file's own
            rows = rows.cast(stored)
        self._writer.write_table(rows, row_group_size=rows.num_rows)
        self._row_group_sizes.append(rows.nbytes)
        if self._sink.tell() >= self._max_bytes:
            self._close_file()

    def _file_schema(self) -> tuple[pa.Schema, str]:
        """The open file's stored schema and its fingerprint, made once per lattice schema."""
        if self._stored is None or self._stored[0] is not self._schema:
            stored = _stored_schema(self._schema, self._unstored, self._bookkeeping)
            self._stored = (self._schema, stored, schema_fingerprint(stored))
        return self._stored[1], self._stored[2]

    def _open(self, stored: pa.Schema) -> None:
        """A new file in the scratch directory, made if missing (checked only then: a file a range)."""
        self._path = self._directory / f"{self._topic}-{self._partition}-{uuid.uuid4().hex}.parquet"
        try:
            self._sink = pa.OSFile(str(self._path), "wb")
        except FileNotFoundError:
            self._directory.mkdir(parents=True, exist_ok=True)
            self._sink = pa.OSFile(str(self._path), "wb")
        self._writer = pq.ParquetWriter(self._sink, stored, compression=self._compression)

    def _close_file(self) -> None:
        self._write_row_group()
        if self._writer is None:
            return
        if self._bookkeeping or not self._raise_by_written:  # for a typed table: its merge cuts by these
            self._writer.add_key_value_metadata({ROW_GROUP_BYTES_KEY: ",".join(map(str, self._row_group_sizes))})
        self._writer.close()
        size = self._sink.tell()
        self._sink.close()
        rows = self._file_rows
        if self._compactor is not None:
            rows = self._compactor.finish(self._path, self._compression)
            size = os.path.getsize(self._path)  # rewritten if a key recurred across row groups
        closed = ClosedFile(
            path=self._path,
            topic=self._topic,
            partition=self._partition,
            first_offset=self._first_offset,
            last_offset=self._last_offset,
            record_count=rows,
            size_bytes=size,
            schema_fingerprint=self._file_schema()[1],
            decoded_bytes=sum(self._row_group_sizes),
        )
        self._writer, self._sink, self._path, self._file_rows, self._row_group_sizes = None, None, None, 0, []
        self._on_close(closed)
        self._written = self._schema if self._written is None else join_schemas(self._written, self._schema)
        if not self._raise_by_written:
            self._schema = None  # the next file takes its own rows' types
