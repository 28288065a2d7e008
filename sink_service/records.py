"""Kafka records to typed rows: JSON values become columns, Kafka metadata becomes `_` columns.

The fast path parses a whole chunk of values with `pyarrow.json` in one call. Only a chunk that
fails to parse is bisected, to find the bad records and the boundaries between incompatible
inferred schemas; a healthy stream never pays for a per-record Python loop.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

# Columns of one raw Kafka record batch, as read from one topic-partition offset range.
RAW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp_ms", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
])

METADATA_COLUMNS = ("_key", "_topic", "_partition", "_offset", "_timestamp")
BAD_RECORD_KINDS = (
    "tombstone", "empty_value", "invalid_json", "schema_mismatch", "reserved_field", "missing_key",
)


@dataclass(frozen=True)
class DecodeSpec:
    value_schema: pa.Schema | None  # None: infer per chunk
    primary_keys: tuple[str, ...]
    order_field: str


@dataclass(frozen=True)
class BadRecord:
    topic: str
    partition: int
    offset: int
    reason: str
    kind: str = "invalid_json"  # stable label for metrics: see BAD_RECORD_KINDS

    def describe(self) -> str:
        return f"topic={self.topic} partition={self.partition} offset={self.offset}: {self.reason}"


@dataclass
class DecodedChunk:
    """Decoded rows in offset order, as segments that each have one schema."""

    segments: list[pa.Table] = field(default_factory=list)
    bad_records: list[BadRecord] = field(default_factory=list)


class _ParseFailure(Exception):
    pass


def _read_json(values: pa.Array, spec: DecodeSpec) -> pa.Table:
    """Parse newline-joined JSON objects; fail unless every value gave exactly one row."""
    # JSON forbids raw newlines inside strings, so any newline in a value is whitespace and
    # can be blanked; that keeps one record per line. Empty values were removed before, so a
    # value holding two objects shows up as a row-count mismatch instead of cancelling out.
    cleaned = pc.replace_substring(values, b"\n", b" ")
    joined = pc.binary_join_element_wise(cleaned, pa.scalar(b"", pa.binary()), b"\n")
    _, offsets_buffer, data = joined.buffers()
    offsets = pa.Array.from_buffers(pa.int32(), len(joined) + 1, [None, offsets_buffer], offset=joined.offset)
    payload = data[offsets[0].as_py():offsets[-1].as_py()]
    read_options = pj.ReadOptions(use_threads=False, block_size=max(len(payload) + 1, 1 << 16))
    try:
        table = pj.read_json(io.BytesIO(payload), read_options=read_options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _ParseFailure(str(exc)) from None
    if table.num_rows != len(values):
        raise _ParseFailure("value is not a single JSON object")
    if spec.value_schema is not None:
        table = _apply_declared(table, spec.value_schema)
    return table


def _apply_declared(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Project onto the declared fields, converting JSON's types (e.g. "2024-01-02" to DATE)."""
    columns = []
    for declared in schema:
        if declared.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, declared.type))
            continue
        column = table.column(declared.name)
        try:
            columns.append(column.cast(declared.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise _ParseFailure(f"field `{declared.name}` is not a valid {declared.type}: {exc}") from None
    return pa.Table.from_arrays(columns, schema=schema)


def _parse_segments(values: pa.Array, spec: DecodeSpec) -> list[tuple[int, int, pa.Table | str]]:
    """(start, end, table) for parsed runs and (i, i+1, reason) for each bad value."""
    try:
        return [(0, len(values), _read_json(values, spec))]
    except _ParseFailure as exc:
        if len(values) == 1:
            return [(0, 1, _reason(str(exc)))]
    mid = len(values) // 2
    left = _parse_segments(values.slice(0, mid), spec)
    right = _parse_segments(values.slice(mid), spec)
    return left + [(s + mid, e + mid, t) for s, e, t in right]


def _reason(message: str) -> str:
    """One readable line: Arrow's parse errors name a row of the chunk, which means nothing here."""
    first_line = message.split("\n")[0].strip()
    if first_line.startswith("JSON parse error: "):
        return "invalid JSON: " + re.sub(r"\s+in row \d+$", "", first_line.removeprefix("JSON parse error: "))
    return first_line


def _merge_adjacent(parts: list[tuple[int, int, pa.Table]]) -> list[tuple[int, int, pa.Table]]:
    """Re-join neighbouring runs that a bisection split but whose schemas are compatible."""
    merged: list[tuple[int, int, pa.Table]] = []
    for start, end, table in parts:
        if merged and merged[-1][1] == start:
            prev_start, _, prev = merged[-1]
            try:
                combined = pa.concat_tables([prev, table], promote_options="permissive")
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                merged.append((start, end, table))
                continue
            merged[-1] = (prev_start, end, combined)
        else:
            merged.append((start, end, table))
    return merged


def _decode_keys(keys: pa.Array) -> pa.Array:
    try:
        return keys.cast(pa.string())
    except pa.ArrowInvalid:
        # Not UTF-8: keep every key, escaping the bytes that are not text.
        return pa.array(
            [None if k is None else k.decode("utf-8", "backslashreplace") for k in keys.to_pylist()],
            pa.string(),
        )


def _split_collisions(values: pa.Table, raw: pa.RecordBatch) -> tuple[pa.Table, pa.RecordBatch, list[BadRecord]]:
    """Reject the rows whose value sets a field named like a metadata column; keep the others."""
    names = [n for n in values.column_names if n in METADATA_COLUMNS]
    if not names:
        return values, raw, []
    rejected: dict[int, str] = {}
    for name in names:
        for row in pc.indices_nonzero(pc.is_valid(values.column(name))).to_pylist():
            rejected.setdefault(row, f"value has a field `{name}`, which collides with a metadata column")
    keep = pa.array([row not in rejected for row in range(values.num_rows)])
    bad = [_bad_record(raw, row, reason, "reserved_field") for row, reason in sorted(rejected.items())]
    return values.drop_columns(names).filter(keep), raw.filter(keep), bad


def _bad_record(rows: pa.RecordBatch | pa.Table, row: int, reason: str, kind: str) -> BadRecord:
    topic, partition, offset = ("topic", "partition", "offset") if "topic" in rows.column_names else (
        "_topic", "_partition", "_offset")
    return BadRecord(rows.column(topic)[row].as_py(), rows.column(partition)[row].as_py(),
                     rows.column(offset)[row].as_py(), reason, kind)


def _with_metadata(values: pa.Table, raw: pa.RecordBatch) -> pa.Table:
    columns = {
        "_key": _decode_keys(raw.column("key")),
        "_topic": raw.column("topic"),
        "_partition": raw.column("partition"),
        "_offset": raw.column("offset"),
        "_timestamp": raw.column("timestamp_ms").cast(pa.timestamp("ms", tz="UTC")),
    }
    table = values
    for name, column in columns.items():
        table = table.append_column(name, column)
    return table


def _required_columns(spec: DecodeSpec) -> list[str]:
    required = list(spec.primary_keys)
    if spec.primary_keys and spec.order_field not in required:
        required.append(spec.order_field)
    return required


def _validate_keys(table: pa.Table, spec: DecodeSpec) -> tuple[pa.Table, list[BadRecord]]:
    """Drop rows lacking a primary key or order value, and report each one."""
    reasons: dict[int, str] = {}
    for name in _required_columns(spec):
        role = "primary key" if name in spec.primary_keys else "order field"
        if name not in table.column_names:
            return table.slice(0, 0), [
                _bad_record(table, row, f"{role} field `{name}` is missing", "missing_key")
                for row in range(table.num_rows)
            ]
        for row in pc.indices_nonzero(pc.is_null(table.column(name))).to_pylist():
            reasons.setdefault(row, f"{role} field `{name}` is missing or null")
    if not reasons:
        return table, []
    keep = pa.array([row not in reasons for row in range(table.num_rows)])
    bad = [_bad_record(table, row, reason, "missing_key") for row, reason in sorted(reasons.items())]
    return table.filter(keep), bad


def decode(raw: pa.RecordBatch, spec: DecodeSpec) -> DecodedChunk:
    """Decode one raw batch of a single topic-partition."""
    chunk = DecodedChunk()
    if raw.num_rows == 0:
        return chunk
    topic = raw.column("topic")[0].as_py()
    partition = raw.column("partition")[0].as_py()
    offsets = raw.column("offset")

    def bad(row: int, reason: str, kind: str) -> None:
        chunk.bad_records.append(BadRecord(topic, partition, offsets[row].as_py(), reason, kind))

    values = raw.column("value")
    tombstones = pc.is_null(values)
    empty = pc.fill_null(pc.match_substring_regex(values, r"^\s*$"), False)
    unusable = pc.or_(tombstones, empty)
    if pc.any(unusable).as_py():
        for row in pc.indices_nonzero(unusable).to_pylist():
            if tombstones[row].as_py():
                bad(row, "value is null (tombstone); deletes are not supported by upsert targets", "tombstone")
            else:
                bad(row, "value is empty", "empty_value")
        raw = raw.filter(pc.invert(unusable))
        offsets = raw.column("offset")
    if raw.num_rows == 0:
        return chunk

    parts: list[tuple[int, int, pa.Table]] = []
    for start, end, parsed in _parse_segments(raw.column("value"), spec):
        if isinstance(parsed, str):
            bad(start, parsed, "schema_mismatch" if parsed.startswith("field `") else "invalid_json")
        else:
            parts.append((start, end, parsed))
    for start, end, values in _merge_adjacent(parts):
        values, rows, collisions = _split_collisions(values, raw.slice(start, end - start))
        table, missing_keys = _validate_keys(_with_metadata(values, rows), spec)
        chunk.bad_records += collisions + missing_keys
        if table.num_rows:
            chunk.segments.append(table)
    chunk.bad_records.sort(key=lambda b: b.offset)
    return chunk


