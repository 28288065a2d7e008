"""Raw Kafka records to typed rows, one stage per module, in the order `decode` runs them:

    raw.py              the raw batch the range reader yields (RAW_SCHEMA)
    keys.py             the Kafka key: `_key`, or with SINK_KEY_FORMAT=json|avro|protobuf its fields
                        as columns
    tombstones.py       records with a null value: skipped, bad records, or rows marked `_deleted`
    json_values.py      JSON object values to typed rows, chunk-wise (json_paths.py: the slow path's
                        JSON trees; declared_schema.py: SINK_VALUE_SCHEMA)
    avro_values.py      SINK_VALUE_FORMAT=avro: Avro values (fastavro) under a schema-derived Arrow schema
    protobuf_values.py  SINK_VALUE_FORMAT=protobuf: Protobuf values (the protobuf runtime), likewise
    csv_values.py       SINK_VALUE_FORMAT=csv: a CSV row per value, chunk-wise (pyarrow.csv); and raw
    registry.py         the Confluent wire format, and schemas by id from SINK_SCHEMA_REGISTRY_URL,
                        cached per worker; a registry that does not answer is an outage
    metadata.py         Kafka metadata as `_` columns (headers.py: `_headers` as JSON)
    obfuscate.py        sensitive fields masked or hashed (SINK_OBFUSCATE_FIELDS)
    flatten.py          nested objects as `parent_child` columns (SINK_FLATTEN)
    (../transform.py)   SINK_TRANSFORM_SQL over the shaped rows, when set
    required_fields.py  rows without a primary key or order value
    bad_records.py      what could not become a row, by topic, partition and offset
    (uploader/column_types.py) the widening lattice that joins types, here, between files and in
                        a Delta table
    compact.py          the latest row per key in a file (SINK_COMPACT_FILES), used by the file writer

Every stage works on a whole batch at once; only what fails is looked at record by record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from sink_service.decode.bad_records import BadRecord, Failures, bad_records, kept
from sink_service.decode.csv_values import CsvFormat, parse_csv, parse_raw
from sink_service.decode.flatten import FieldCollision, flatten
from sink_service.decode.json_values import ParsedValues, parse_objects
from sink_service.decode.keys import (
    STRUCTURED_KEY_FORMATS,
    key_fields,
    learned_primary_keys,
    no_columns,
    unexpected_fields,
    with_key_fields,
)
from sink_service.decode.metadata import split_reserved, with_metadata, written_metadata
from sink_service.decode.obfuscate import obfuscate
from sink_service.decode.raw import RAW_SCHEMA
from sink_service.decode.registry import RegistrySettings
from sink_service.decode.required_fields import missing_fields
from sink_service.decode.tombstones import DELETED, tombstone_failures, with_deleted
from sink_service.shared.column_names import DEFAULT_METADATA_COLUMNS, METADATA_COLUMNS, OFFSET, column_name
from sink_service.transform.rows import Transform, TransformFailed
from uploader.column_types import unify

__all__ = ["RAW_SCHEMA", "BadRecord", "DecodeSpec", "DecodedChunk", "decode"]


@dataclass(frozen=True)
class DecodeSpec:
    value_schema: pa.Schema | None  # None: infer per chunk
    # With `primary_keys_from_key`, empty until learned from a key (`DecodedChunk.primary_keys`).
    primary_keys: tuple[str, ...]
    order_field: str
    key_format: str = "string"  # keys.KEY_FORMATS
    key_fields_prefix: str = ""
    tombstones: str = "skip"  # tombstones.TOMBSTONE_POLICIES
    metadata_columns: tuple[str, ...] = DEFAULT_METADATA_COLUMNS  # as selected; see `written_metadata`
    primary_keys_from_key: bool = False  # SINK_PRIMARY_KEYS unset with structured keys: the key's fields
    value_format: str = "json"  # SINK_VALUE_FORMAT
    registry: RegistrySettings | None = None  # for the avro and protobuf formats
    csv: CsvFormat | None = None  # for the csv format
    flatten: bool = False
    flatten_discard_collections: bool = False
    lowercase_fields: bool = False
    decimals_as_double: bool = False
    obfuscate_fields: tuple[str, ...] = ()
    obfuscation_method: str = "fix"
    obfuscation_salt: bytes = field(default=b"", repr=False)

    def column(self, name: str) -> str:
        """The column a top-level field is written as (flattening sanitises names)."""
        return column_name([name], lowercase=self.lowercase_fields) if self.flatten else name

    @property
    def written_metadata(self) -> tuple[str, ...]:
        return written_metadata(self.metadata_columns, self.order_field, self.primary_keys)

    @property
    def unstored_columns(self) -> tuple[str, ...]:
        """Columns decoded for bookkeeping that files leave out: `_offset` when it is not written."""
        return () if OFFSET in self.written_metadata else (OFFSET,)

    @property
    def reserved(self) -> tuple[str, ...]:
        return METADATA_COLUMNS + ((DELETED,) if self.tombstones == "soft-delete" else ())


@dataclass
class DecodedChunk:
    """Decoded rows in offset order: one segment (types joined by the lattice), none if no record is good."""

    segments: list[pa.Table] = field(default_factory=list)
    bad_records: list[BadRecord] = field(default_factory=list)  # under SINK_ERROR_POLICY
    skipped: list[BadRecord] = field(default_factory=list)  # left out on purpose (tombstones): never a failure
    primary_keys: tuple[str, ...] = ()  # the spec's, or the columns of the key fields learned from this chunk
    filtered: int = 0  # records SINK_TRANSFORM_SQL's WHERE left out: processed, neither rows nor bad records


@dataclass(frozen=True)
class _Rows:
    """Records and the fields decoded from them so far, row for row."""

    raw: pa.RecordBatch
    fields: pa.Table

    def take(self, rows: pa.Array) -> _Rows:
        return _Rows(self.raw.take(rows), self.fields.take(rows))

    def filter(self, mask: pa.Array) -> _Rows:
        return _Rows(self.raw.filter(mask), self.fields.filter(mask))

    def without(self, failures: Failures, chunk: DecodedChunk) -> _Rows:
        """These rows but the failing ones, which become the chunk's bad records."""
        if not failures:
            return self
        chunk.bad_records += bad_records(self.raw, failures)
        return self.filter(kept(self.raw.num_rows, failures))


def decode(raw: pa.RecordBatch, spec: DecodeSpec, transform: Transform | None = None) -> DecodedChunk:
    """Decode one raw batch of a single topic-partition into (at most) one segment.

    With a `transform`, the primary keys and the order field name columns of its output: they are
    checked after it. It raises `TransformFailed` when it fails on any of the rows."""
    chunk = DecodedChunk(primary_keys=spec.primary_keys)
    rows = _Rows(raw, no_columns(raw.num_rows))
    if spec.key_format in STRUCTURED_KEY_FORMATS and raw.num_rows:
        rows = _with_key_fields(rows, spec, chunk)
    rows, deletions = _split_tombstones(rows, spec, chunk)
    parts = [part for part in (_with_values(rows, spec, chunk), deletions) if part is not None and part.raw.num_rows]
    if parts:
        rows = _in_offset_order(parts)
        rows = _shaped(_Rows(rows.raw, with_metadata(rows.fields, rows.raw, spec.written_metadata, spec.key_format)),
                       spec, chunk)
        if transform is not None:
            rows = _transformed(rows, transform, chunk)
        rows = rows.without(_required_failures(rows.fields, spec, chunk, transform), chunk)
        if rows.raw.num_rows:
            chunk.segments.append(rows.fields)
    chunk.bad_records.sort(key=lambda b: b.offset)
    return chunk


def _with_key_fields(rows: _Rows, spec: DecodeSpec, chunk: DecodedChunk) -> _Rows:
    """The keys' fields; with primary keys from the key, only those every key must have."""
    parse = None if spec.key_format == "json" else _parser(spec.key_format, spec)
    keys = key_fields(rows.raw.column("key"), spec.key_fields_prefix, parse)
    rows = _Rows(rows.raw, keys.table).without(keys.failures, chunk)
    if not spec.primary_keys_from_key:
        return rows
    if not chunk.primary_keys:
        chunk.primary_keys = tuple(sorted(spec.column(name) for name in learned_primary_keys(rows.fields)))
    fields, unexpected = unexpected_fields(rows.fields, chunk.primary_keys, spec.column)
    return _Rows(rows.raw, fields).without(unexpected, chunk)


def _split_tombstones(rows: _Rows, spec: DecodeSpec, chunk: DecodedChunk) -> tuple[_Rows, _Rows | None]:
    """The records with a value, and the deletion rows (SINK_TOMBSTONES=soft-delete) if any."""
    values = rows.raw.column("value")
    if not values.null_count:
        return rows, None
    present = pc.is_valid(values)
    tombstones = rows.filter(pc.invert(present))
    if spec.tombstones == "soft-delete":
        return rows.filter(present), _marked(tombstones, spec, chunk, deleted=True)
    failures = tombstone_failures(tombstones.raw, spec.tombstones)
    (chunk.skipped if spec.tombstones == "skip" else chunk.bad_records).extend(bad_records(tombstones.raw, failures))
    return rows.filter(present), None


def _with_values(rows: _Rows, spec: DecodeSpec, chunk: DecodedChunk) -> _Rows | None:
    """Rows of the values that parse, each with its key's fields."""
    if not rows.raw.num_rows:
        return None
    parsed = _parser(spec.value_format, spec)(rows.raw.column("value"))
    chunk.bad_records += bad_records(rows.raw, parsed.failures)
    if parsed.table is None:
        return None
    rows = rows if parsed.rows is None else rows.take(parsed.rows)
    return _marked(_Rows(rows.raw, with_key_fields(rows.fields, parsed.table)), spec, chunk, deleted=False)


def _parser(value_format: str, spec: DecodeSpec) -> Callable[[pa.Array], ParsedValues]:
    """The decoder of one format: binary values (no nulls) to rows."""
    # fastavro and the protobuf runtime load only where values are in their format: ~55 ms and
    # ~3 MB in every Python worker otherwise, on the first batch's way.
    if value_format == "avro":
        from sink_service.decode.avro_values import parse_avro

        return partial(parse_avro, registry=spec.registry)
    if value_format == "protobuf":
        from sink_service.decode.protobuf_values import parse_protobuf

        return partial(parse_protobuf, registry=spec.registry)
    if value_format == "csv":
        return partial(parse_csv, fmt=spec.csv)
    if value_format == "raw":
        return parse_raw
    return partial(parse_objects, value_schema=spec.value_schema)


def _marked(rows: _Rows, spec: DecodeSpec, chunk: DecodedChunk, *, deleted: bool) -> _Rows:
    """Rows without those setting a reserved field; with `_deleted` under soft-delete."""
    fields, reserved = split_reserved(rows.fields, spec.reserved)
    rows = _Rows(rows.raw, fields).without(reserved, chunk)
    return _Rows(rows.raw, with_deleted(rows.fields, deleted)) if spec.tombstones == "soft-delete" else rows


def _shaped(rows: _Rows, spec: DecodeSpec, chunk: DecodedChunk) -> _Rows:
    """Rows with the sensitive fields obfuscated, then flattened; a record whose fields cannot share
    their flattened column is a bad record."""
    table = rows.fields
    if spec.obfuscate_fields:
        table = obfuscate(table, spec.obfuscate_fields, spec.obfuscation_method, spec.obfuscation_salt)
    if not spec.flatten:
        return _Rows(rows.raw, table)
    flat = partial(flatten, metadata=spec.reserved, discard_collections=spec.flatten_discard_collections,
                   lowercase=spec.lowercase_fields, decimals_as_double=spec.decimals_as_double)
    try:
        return _Rows(rows.raw, flat(table))
    except FieldCollision as exc:
        rows = _Rows(rows.raw, table).without(exc.failures, chunk)
    return _Rows(rows.raw, flat(rows.fields))


def _in_offset_order(parts: list[_Rows]) -> _Rows:
    """One set of rows: deletion rows merged into the value rows by offset."""
    if len(parts) == 1:
        return parts[0]
    raw = pa.Table.from_batches([p.raw for p in parts]).combine_chunks().to_batches()[0]
    rows = _Rows(raw, pa.concat_tables(unify([p.fields for p in parts])))
    return rows.take(pc.sort_indices(raw.column("offset")))


def _transformed(rows: _Rows, transform: Transform, chunk: DecodedChunk) -> _Rows:
    """The statement's rows, each beside its record; the records its WHERE left out are counted."""
    out = transform.apply(rows.fields)
    if out.num_rows == rows.raw.num_rows:  # offsets strictly increase and come from the input: the same rows
        return _Rows(rows.raw, out)
    raw = rows.raw.filter(pc.is_in(rows.raw.column("offset"), value_set=out.column(OFFSET).combine_chunks()))
    if raw.num_rows != out.num_rows:
        raise TransformFailed("its output rows do not match the records' offsets")
    chunk.filtered += rows.raw.num_rows - raw.num_rows
    return _Rows(raw, out)


def _required_failures(table: pa.Table, spec: DecodeSpec, chunk: DecodedChunk,
                       transform: Transform | None) -> Failures:
    if spec.primary_keys_from_key and not chunk.primary_keys:
        reason = "record has no key, and the primary keys are the key's fields (SINK_PRIMARY_KEYS is unset)"
        return {row: (reason, "missing_key") for row in range(table.num_rows)}
    failures = missing_fields(table, chunk.primary_keys, spec.order_field)
    if transform is None:
        return failures
    return {row: (f"{reason} after SINK_TRANSFORM_SQL", kind) for row, (reason, kind) in failures.items()}
