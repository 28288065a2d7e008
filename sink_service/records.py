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

# Columns of one raw Kafka record batch, as yielded by the Kafka source. A row whose `offset` is
# null is a range marker: it carries only the range bounds of an offset range with no records.
RAW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp_ms", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("range_start", pa.int64()),
    ("range_end", pa.int64()),
])
RAW_SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, timestamp_ms BIGINT, key BINARY, value BINARY, "
    "range_start BIGINT, range_end BIGINT"
)

METADATA_COLUMNS = ("_key", "_topic", "_partition", "_offset", "_timestamp")


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
    # can be blanked; that keeps one record per line.
    cleaned = pc.replace_substring(values, b"\n", b" ")
    joined = pc.binary_join_element_wise(cleaned, pa.scalar(b"", pa.binary()), b"\n")
    _, offsets_buffer, data = joined.buffers()
    offsets = pa.Array.from_buffers(pa.int32(), len(joined) + 1, [None, offsets_buffer], offset=joined.offset)
    payload = data[offsets[0].as_py():offsets[-1].as_py()]
    read_options = pj.ReadOptions(use_threads=False, block_size=max(len(payload) + 1, 1 << 16))
    parse_options = pj.ParseOptions(
        explicit_schema=spec.value_schema,
        unexpected_field_behavior="ignore" if spec.value_schema is not None else "infer",
    )
    try:
        table = pj.read_json(io.BytesIO(payload), read_options=read_options, parse_options=parse_options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _ParseFailure(str(exc)) from None
    if table.num_rows != len(values):
        raise _ParseFailure("value is empty or not a single JSON object")
    return table


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


def _reason(arrow_message: str) -> str:
    message = arrow_message.split("\n")[0].strip()
    message = re.sub(r"\s+in row \d+$", "", message.removeprefix("JSON parse error: "))
    return f"not a valid JSON object ({message})" if "JSON" not in message else message


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


def _validate_keys(table: pa.Table, spec: DecodeSpec) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Drop rows lacking a primary key or order value; return them as (row, reason)."""
    bad_mask = None
    reasons: dict[int, str] = {}
    for name in _required_columns(spec):
        role = "primary key" if name in spec.primary_keys else "order field"
        if name not in table.column_names:
            for row in range(table.num_rows):
                reasons.setdefault(row, f"{role} field `{name}` is missing")
            return table.slice(0, 0), sorted(reasons.items())
        nulls = pc.is_null(table.column(name))
        if pc.any(nulls).as_py():
            for row in pc.indices_nonzero(nulls).to_pylist():
                reasons.setdefault(row, f"{role} field `{name}` is null")
            bad_mask = nulls if bad_mask is None else pc.or_(bad_mask, nulls)
    if bad_mask is None:
        return table, []
    return table.filter(pc.invert(bad_mask)), sorted(reasons.items())


def decode(raw: pa.RecordBatch, spec: DecodeSpec) -> DecodedChunk:
    """Decode one raw batch of a single topic-partition (range-marker rows are ignored)."""
    chunk = DecodedChunk()
    raw = raw.filter(pc.is_valid(raw.column("offset")))
    if raw.num_rows == 0:
        return chunk
    topic = raw.column("topic")[0].as_py()
    partition = raw.column("partition")[0].as_py()
    offsets = raw.column("offset")

    def bad(row: int, reason: str) -> None:
        chunk.bad_records.append(BadRecord(topic, partition, offsets[row].as_py(), reason))

    tombstones = pc.is_null(raw.column("value"))
    if pc.any(tombstones).as_py():
        for row in pc.indices_nonzero(tombstones).to_pylist():
            bad(row, "value is null (tombstone); deletes are not supported by upsert targets")
        keep = pc.invert(tombstones)
        raw = raw.filter(keep)
        offsets = raw.column("offset")
        chunk.bad_records.sort(key=lambda b: b.offset)
    if raw.num_rows == 0:
        return chunk

    parts: list[tuple[int, int, pa.Table]] = []
    for start, end, parsed in _parse_segments(raw.column("value"), spec):
        if isinstance(parsed, str):
            bad(start, parsed)
        else:
            parts.append((start, end, parsed))
    for start, end, values in _merge_adjacent(parts):
        collision = [name for name in values.column_names if name in METADATA_COLUMNS]
        if collision:
            for row in range(start, end):
                bad(row, f"value has field(s) {collision} that collide with metadata columns")
            continue
        table = _with_metadata(values, raw.slice(start, end - start))
        table, rejected = _validate_keys(table, spec)
        for row, reason in rejected:
            bad(start + row, reason)
        if table.num_rows:
            chunk.segments.append(table)
    chunk.bad_records.sort(key=lambda b: b.offset)
    return chunk


