"""Raw Kafka records to typed rows, one stage per module, in the order `decode` runs them:

    raw.py              the raw batch the range reader yields (RAW_SCHEMA)
    tombstones.py       records with a null value
    json_values.py      JSON object values to typed rows, chunk-wise (json_paths.py: the slow path's
                        JSON trees; declared_schema.py: SINK_VALUE_SCHEMA)
    metadata.py         Kafka metadata as `_` columns (keys.py: the Kafka key)
    required_fields.py  rows without a primary key or order value
    bad_records.py      what could not become a row, by topic, partition and offset
    column_types.py     the widening lattice that joins types, here and between files

Every stage works on a whole batch at once; only what fails is looked at record by record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from sink_service.decode.bad_records import BadRecord, Failures, bad_records, kept, reject
from sink_service.decode.json_values import parse_objects
from sink_service.decode.metadata import split_reserved, with_metadata
from sink_service.decode.raw import RAW_SCHEMA
from sink_service.decode.required_fields import missing_fields
from sink_service.decode.tombstones import tombstone_failures

__all__ = ["RAW_SCHEMA", "BadRecord", "DecodeSpec", "DecodedChunk", "decode"]


@dataclass(frozen=True)
class DecodeSpec:
    value_schema: pa.Schema | None  # None: infer per chunk
    primary_keys: tuple[str, ...]
    order_field: str


@dataclass
class DecodedChunk:
    """Decoded rows in offset order: one segment (types joined by the lattice), none if no record is good."""

    segments: list[pa.Table] = field(default_factory=list)
    bad_records: list[BadRecord] = field(default_factory=list)


def decode(raw: pa.RecordBatch, spec: DecodeSpec) -> DecodedChunk:
    """Decode one raw batch of a single topic-partition into (at most) one segment."""
    chunk = DecodedChunk()
    raw, chunk.bad_records = reject(raw, tombstone_failures(raw.column("value")))
    if raw.num_rows:
        parsed = parse_objects(raw.column("value"), spec.value_schema)
        chunk.bad_records += bad_records(raw, parsed.failures)
        if parsed.table is not None:
            raw = raw if parsed.rows is None else raw.take(parsed.rows)
            values, reserved = split_reserved(parsed.table)
            table, raw = _without(with_metadata(values, raw), raw, reserved, chunk)
            table, raw = _without(table, raw, missing_fields(table, spec.primary_keys, spec.order_field), chunk)
            if table.num_rows:
                chunk.segments.append(table)
    chunk.bad_records.sort(key=lambda b: b.offset)
    return chunk


def _without(table: pa.Table, raw: pa.RecordBatch, failures: Failures,
             chunk: DecodedChunk) -> tuple[pa.Table, pa.RecordBatch]:
    """`table` and its records without the failing rows, which become the chunk's bad records."""
    if not failures:
        return table, raw
    chunk.bad_records += bad_records(raw, failures)
    mask = kept(table.num_rows, failures)
    return table.filter(mask), raw.filter(mask)
