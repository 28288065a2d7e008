"""Kafka records to typed rows: JSON values become columns, Kafka metadata becomes `_` columns.

The fast path parses a whole chunk of values with `pyarrow.json` in one call. Only a chunk that
fails to parse is bisected, to find the bad records and the boundaries between incompatible
inferred types; a healthy stream never pays for a per-record Python loop. The parts a
bisection finds are joined again by the widening lattice (`sink_service.column_types`), so a
chunk always gives one segment, whatever types its fields flip between.

Inference never changes a value. Where `pyarrow.json` would, the chunk is parsed a second time
with an explicit schema, and only then:
- Strings stay strings. `pyarrow.json` reads ISO-8601 text as timestamps (converting any
  offset to UTC, and only when no fractional seconds are present); a chunk whose inferred
  schema holds a timestamp is parsed again with those fields (nested too) as strings. A field
  is a timestamp only when SINK_VALUE_SCHEMA declares it one (or a date).
- Integers beyond int64 arrive exactly. `pyarrow.json` reads them as doubles, and every such
  integer becomes a double of magnitude >= 2**63; only when a double column holds one are the
  values with such an integer token parsed in Python to find their fields. Those fields are
  then parsed as decimal(38,0), or as strings holding the digits when an integer has more than
  38 digits or the field also holds fractions in this chunk.
- Empty objects and arrays are rows like any other. A struct without fields (recursively) holds
  no value and Parquet cannot store one, so it has no column; once later records give it fields
  it is a struct, null in the rows before. Inside a list, an empty object is a null element
  (the list keeps its length); beside objects with fields in the same chunk it is a struct whose
  fields are null. An empty array is a list of null type, stored as a list of strings.
- Invalid JSON is a bad record (`invalid_json`), never repaired: bytes that are not UTF-8, a raw
  newline or other control character inside a string. Newlines between tokens are whitespace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from sink_service.column_types import convert, unify, without_empty_structs
from sink_service.json_paths import ITEM, Path, big_integer_digits, quote_at, quote_mixed

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
    "tombstone", "empty_value", "invalid_json", "schema_mismatch", "reserved_field", "missing_key", "unwritable",
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
    """Decoded rows in offset order: one segment (types joined by the lattice), none if no record is good."""

    segments: list[pa.Table] = field(default_factory=list)
    bad_records: list[BadRecord] = field(default_factory=list)


class _ParseFailure(Exception):
    pass


_INT64_MAGNITUDE = 2.0**63  # every integer beyond int64 parses to a double at least this large
# An integer token beyond int64 (9223372036854775807 has 19 digits): 20 or more digits, or 19
# starting with 9. RE2 syntax, as pyarrow.compute takes it.
_BIG_INTEGER_TOKEN = r"[:\[,]\s*-?(?:[1-9][0-9]{19,}|9[0-9]{18})\s*[,\]}]"
_DECIMAL = pa.decimal128(38, 0)
_SAMPLE = 16  # values with big integers looked at first; all of them only if that missed a field


def _read_json(values: pa.Array, spec: DecodeSpec) -> pa.Table:
    """Parse one JSON object per value; fail unless every value gave exactly one row."""
    payload = _joined(values)
    table = _parse(payload, len(values))
    text = _timestamp_paths(table.schema, spec)
    if _holds_big_doubles(table):
        table = _exact_integers(table, values, payload, text)
    elif text:
        table = _parse(payload, len(values), _with_types(table.schema, text))
    table = without_empty_structs(table)
    if spec.value_schema is not None:
        table = _apply_declared(table, spec.value_schema)
    return table


def _joined(values: pa.Array) -> pa.Buffer:
    """The values, each followed by a newline, as one buffer."""
    # pyarrow.json parses consecutive objects with or without whitespace between them, so a
    # value holding two objects gives two rows: a row-count mismatch. Empty values were removed
    # before, so that cannot cancel out.
    joined = pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), b"\n")
    _, offsets_buffer, data = joined.buffers()
    offsets = pa.Array.from_buffers(pa.int32(), len(joined) + 1, [None, offsets_buffer], offset=joined.offset)
    return data[offsets[0].as_py():offsets[-1].as_py()]


def _parse(payload: pa.Buffer, rows: int, schema: pa.Schema | None = None) -> pa.Table:
    # One block: the reader never cuts the payload at a newline, so a value that spans lines
    # (newlines between tokens) parses; a raw newline inside a string stays an error.
    read_options = pj.ReadOptions(use_threads=False, block_size=max(len(payload) + 1, 1 << 16))
    parse_options = pj.ParseOptions() if schema is None else pj.ParseOptions(explicit_schema=schema)
    try:
        table = pj.read_json(pa.BufferReader(payload), read_options=read_options, parse_options=parse_options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _ParseFailure(str(exc)) from None
    if table.num_rows != rows:
        raise _ParseFailure("value is not a single JSON object")
    return table


def _timestamp_paths(schema: pa.Schema, spec: DecodeSpec) -> dict[Path, pa.DataType]:
    """Fields read as timestamps from strings, mapped to string; declared timestamps and dates stay."""
    declared = spec.value_schema
    paths: dict[Path, pa.DataType] = {}
    for f in schema:
        if declared is not None and (f.name not in declared.names or _is_temporal(declared.field(f.name).type)):
            continue  # undeclared fields are not written; declared temporal ones are parsed
        paths.update((path, pa.string()) for path in _timestamps(f.type, (f.name,)))
    return paths


def _timestamps(type_: pa.DataType, path: Path) -> Iterable[Path]:
    if pa.types.is_timestamp(type_):
        yield path
    elif pa.types.is_struct(type_):
        for f in type_:
            yield from _timestamps(f.type, (*path, f.name))
    elif pa.types.is_list(type_):
        yield from _timestamps(type_.value_type, (*path, ITEM))


def _is_temporal(type_: pa.DataType) -> bool:
    if pa.types.is_struct(type_):
        return any(_is_temporal(f.type) for f in type_)
    if pa.types.is_list(type_):
        return _is_temporal(type_.value_type)
    return pa.types.is_timestamp(type_) or pa.types.is_date(type_)


def _with_types(schema: pa.Schema, types: dict[Path, pa.DataType]) -> pa.Schema:
    """`schema` with the field at each path given its new type."""
    struct = pa.struct(list(schema))
    for path, type_ in types.items():
        struct = _with_type_at(struct, path, type_)
    return pa.schema(list(struct))


def _with_type_at(type_: pa.DataType, path: Path, new: pa.DataType) -> pa.DataType:
    if not path:
        return new
    step, rest = path[0], path[1:]
    if step is ITEM:
        return pa.list_(type_.value_field.with_type(_with_type_at(type_.value_type, rest, new)))
    return pa.struct([f.with_type(_with_type_at(f.type, rest, new)) if f.name == step else f for f in type_])


def _holds_big_doubles(table: pa.Table) -> bool:
    return any(_big_doubles(column) for column in table.columns)


def _big_doubles(values: pa.ChunkedArray) -> bool:
    """Whether a double here (nested too) is as large as an integer beyond int64 becomes."""
    type_ = values.type
    if pa.types.is_floating(type_):
        largest = pc.max(pc.abs(values)).as_py()
        return largest is not None and largest >= _INT64_MAGNITUDE
    if pa.types.is_list(type_):
        return _big_doubles(pc.list_flatten(values))
    if pa.types.is_struct(type_):
        return any(_big_doubles(pc.struct_field(values, [i])) for i in range(type_.num_fields))
    return False


def _exact_integers(table: pa.Table, values: pa.Array, payload: pa.Buffer, text: dict[Path, pa.DataType]) -> pa.Table:
    """Parse again with the fields holding integers beyond int64 as decimal(38,0) or as text."""
    candidates = values.filter(pc.match_substring_regex(values, _BIG_INTEGER_TOKEN))
    if not len(candidates) and not text:
        return table  # only genuine large doubles
    parts = _Reparse(table.schema, values, payload, text)
    exact = parts.parse(candidates.slice(0, _SAMPLE), complete=len(candidates) <= _SAMPLE)
    if exact is None or (len(candidates) > _SAMPLE and _holds_big_doubles(exact)):
        exact = parts.parse(candidates, complete=True)
    return exact


@dataclass(frozen=True)
class _Reparse:
    schema: pa.Schema
    values: pa.Array
    payload: pa.Buffer
    text: dict[Path, pa.DataType]

    def parse(self, candidates: pa.Array, *, complete: bool) -> pa.Table | None:
        """The chunk with the big integers `candidates` hold made exact; None if it needs all of them."""
        digits = big_integer_digits(candidates.to_pylist())
        as_text = {path for path, n in digits.items() if n > _DECIMAL.precision}
        if not as_text:
            try:
                return _parse(self.payload, len(self.values), self._schema(digits, as_text))
            except _ParseFailure:
                as_text = set(digits)  # the field also holds fractions in this chunk
        if not complete:
            return None  # every field that holds a big integer must be quoted, not only those seen
        quoted = pa.array(quote_at(self.values.to_pylist(), as_text), pa.binary())
        return _parse(_joined(quoted), len(self.values), self._schema(digits, as_text))

    def _schema(self, digits: dict[Path, int], as_text: set[Path]) -> pa.Schema:
        exact = {path: pa.string() if path in as_text else _DECIMAL for path in digits}
        return _with_types(self.schema, self.text | exact)


def _apply_declared(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Project onto the declared fields, converting JSON's types (e.g. "2024-01-02" to DATE)."""
    columns = []
    for declared in schema:
        if declared.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, declared.type))
            continue
        column = table.column(declared.name)
        try:
            if declared.type == pa.string():  # any JSON value has its text, as in Spark's reader
                columns.append(convert(column.combine_chunks(), declared.type))
            else:
                columns.append(column.cast(declared.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise _ParseFailure(f"field `{declared.name}` is not a valid {declared.type}: {exc}") from None
    return pa.Table.from_arrays(columns, schema=schema)


class _TooManyConflicts(Exception):
    pass


@dataclass
class _ConflictBudget:
    """Failed parses caused by conflicting types that bisection may spend before a chunk is
    typed in Python instead: each costs a parse call, and a field that flips in every record
    would otherwise split the chunk down to single records."""

    left: int = 64

    def spend(self, error: str) -> None:
        if "changed from" in error:  # pyarrow: "Column(/x) changed from number to string"
            self.left -= 1
            if self.left < 0:
                raise _TooManyConflicts


Parts = list[tuple[int, int, pa.Table | str]]  # (start, end, table) per parsed run, (i, i+1, reason) per bad value


def _parse_segments(values: pa.Array, spec: DecodeSpec) -> Parts:
    try:
        return _bisect(values, spec, _ConflictBudget())
    except _TooManyConflicts:
        quoted = quote_mixed(values.to_pylist())
    return _bisect(values if quoted is None else pa.array(quoted, pa.binary()), spec, None)


def _bisect(values: pa.Array, spec: DecodeSpec, budget: _ConflictBudget | None) -> Parts:
    try:
        return [(0, len(values), _read_json(values, spec))]
    except _ParseFailure as exc:
        error = str(exc)
    if len(values) == 1:
        return [(0, 1, _parse_alone(values[0].as_py(), spec, error))]
    if budget is not None:
        budget.spend(error)
    mid = len(values) // 2
    left = _bisect(values.slice(0, mid), spec, budget)
    right = _bisect(values.slice(mid), spec, budget)
    return left + [(s + mid, e + mid, t) for s, e, t in right]


def _parse_alone(value: bytes, spec: DecodeSpec, error: str) -> pa.Table | str:
    """One value that failed: if it is JSON whose arrays mix kinds (`[1, {"a": 2}]`), the lattice
    types the mixed values as text (`["1", "{\\"a\\":2}"]`); anything else is a bad record."""
    quoted = quote_mixed([value])
    if quoted is not None:
        try:
            return _read_json(pa.array(quoted, pa.binary()), spec)
        except _ParseFailure as exc:
            error = str(exc)
    return _reason(error)


def _reason(message: str) -> str:
    """One readable line: Arrow's parse errors name a row of the chunk, which means nothing here."""
    first_line = message.split("\n")[0].strip()
    if first_line.startswith("JSON parse error: "):
        return "invalid JSON: " + re.sub(r"\s+in row \d+$", "", first_line.removeprefix("JSON parse error: "))
    return first_line


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


def _unusable(values: pa.Array) -> dict[int, tuple[str, str]]:
    """(reason, kind) of each value that cannot be parsed at all: tombstones, empty, not UTF-8."""
    found: dict[int, tuple[str, str]] = {}
    tombstones = pc.is_null(values)
    empty = pc.fill_null(pc.match_substring_regex(values, r"^\s*$"), False)
    for row in pc.indices_nonzero(pc.or_(tombstones, empty)).to_pylist():
        if tombstones[row].as_py():
            found[row] = ("value is null (tombstone); deletes are not supported by upsert targets", "tombstone")
        else:
            found[row] = ("value is empty", "empty_value")
    try:
        values.cast(pa.string())  # validates UTF-8 for the whole chunk at once
    except pa.ArrowInvalid:
        found.update(_not_utf8(values))
    return found


def _not_utf8(values: pa.Array) -> dict[int, tuple[str, str]]:
    found = {}
    for row, value in enumerate(values.to_pylist()):
        try:
            if value is not None:
                value.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"invalid JSON: value is not UTF-8 (byte 0x{value[exc.start]:02x} at position {exc.start})"
            found[row] = (reason, "invalid_json")
    return found


def decode(raw: pa.RecordBatch, spec: DecodeSpec) -> DecodedChunk:
    """Decode one raw batch of a single topic-partition into (at most) one segment."""
    chunk = DecodedChunk()
    if raw.num_rows == 0:
        return chunk
    topic = raw.column("topic")[0].as_py()
    partition = raw.column("partition")[0].as_py()
    offsets = raw.column("offset")

    def bad(row: int, reason: str, kind: str) -> None:
        chunk.bad_records.append(BadRecord(topic, partition, offsets[row].as_py(), reason, kind))

    unusable = _unusable(raw.column("value"))
    if unusable:
        for row, (reason, kind) in unusable.items():
            bad(row, reason, kind)
        raw = raw.filter(pa.array([row not in unusable for row in range(raw.num_rows)]))
        offsets = raw.column("offset")

    parts: list[pa.Table] = []
    rows: list[int] = []
    for start, end, parsed in _parse_segments(raw.column("value"), spec) if raw.num_rows else []:
        if isinstance(parsed, str):
            bad(start, parsed, "schema_mismatch" if parsed.startswith("field `") else "invalid_json")
        else:
            parts.append(parsed)
            rows.extend(range(start, end))
    if parts:
        values = parts[0] if len(parts) == 1 else pa.concat_tables(unify(parts))
        values, kept, collisions = _split_collisions(values, raw if len(rows) == raw.num_rows else raw.take(rows))
        table, missing_keys = _validate_keys(_with_metadata(values, kept), spec)
        chunk.bad_records += collisions + missing_keys
        if table.num_rows:
            chunk.segments.append(table)
    chunk.bad_records.sort(key=lambda b: b.offset)
    return chunk
