"""JSON object values to typed rows, chunk-wise.

The fast path parses a whole chunk of values with `pyarrow.json` in one call. Only a chunk that
fails to parse is bisected, to find the bad records and the boundaries between incompatible
inferred types; a healthy stream never pays for a per-record Python loop. The parts a
bisection finds are joined again by the widening lattice (`uploader.column_types`),
so a chunk always gives one table, whatever types its fields flip between.

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
  An empty value is a bad record (`empty_value`); null values (tombstones) never reach here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from sink_service.decode.bad_records import Failures, kept
from sink_service.decode.declared_schema import DoesNotFit, apply_declared, is_temporal
from sink_service.decode.json_paths import ITEM, Path, big_integer_digits, quote_at, quote_mixed
from uploader.column_types import unify, without_empty_structs


@dataclass(frozen=True)
class ParsedValues:
    """The rows of the values that parsed (in order), where they came from, and why the others failed."""

    table: pa.Table | None  # None: no value parsed
    rows: pa.Array | None  # positions of the table's rows among the values; None: every value parsed
    failures: Failures

    @classmethod
    def gathered(cls, tables: list[pa.Table], rows: list[int], total: int, failures: Failures) -> ParsedValues:
        """Tables parsed group by group (`rows`: each of their rows' position among `total` values),
        joined by the widening lattice and put back in the values' order."""
        if not tables:
            return cls(None, pa.array([], pa.int64()), failures)
        table = tables[0] if len(tables) == 1 else pa.concat_tables(unify(tables))
        if len(rows) == total and len(tables) == 1:
            return cls(table, None, failures)
        order = np.argsort(np.asarray(rows), kind="stable")
        return cls(table.take(pa.array(order)), pa.array(np.asarray(rows)[order], pa.int64()), failures)


class _ParseFailure(Exception):
    def __init__(self, message: str, kind: str = "invalid_json"):
        super().__init__(message)
        self.kind = kind


_INT64_MAGNITUDE = 2.0**63  # every integer beyond int64 parses to a double at least this large
# An integer token beyond int64 (9223372036854775807 has 19 digits): 20 or more digits, or 19
# starting with 9. RE2 syntax, as pyarrow.compute takes it.
_BIG_INTEGER_TOKEN = r"[:\[,]\s*-?(?:[1-9][0-9]{19,}|9[0-9]{18})\s*[,\]}]"
_DECIMAL = pa.decimal128(38, 0)
_SAMPLE = 16  # values with big integers looked at first; all of them only if that missed a field


def parse_objects(values: pa.Array, value_schema: pa.Schema | None = None) -> ParsedValues:
    """Parse each value (binary, no nulls) as one JSON object; `value_schema`: the declared schema, if any."""
    failures = _unusable(values)
    positions = None
    if failures:
        mask = kept(len(values), failures)
        positions, values = np.flatnonzero(mask.to_numpy(zero_copy_only=False)), values.filter(mask)
    tables: list[pa.Table] = []
    rows: list[int] = []
    for start, end, parsed in _parse_segments(values, value_schema) if len(values) else []:
        if isinstance(parsed, pa.Table):
            tables.append(parsed)
            rows.extend(range(start, end))
        else:
            failures[start if positions is None else int(positions[start])] = parsed
    if not tables:
        return ParsedValues(None, pa.array([], pa.int64()), failures)
    table = tables[0] if len(tables) == 1 else pa.concat_tables(unify(tables))
    if len(rows) == len(values) and positions is None:
        return ParsedValues(table, None, failures)
    return ParsedValues(table, pa.array(rows if positions is None else positions[rows], pa.int64()), failures)


def _unusable(values: pa.Array) -> Failures:
    """(reason, kind) of each value that cannot be parsed at all: empty, not UTF-8."""
    empty = pc.match_substring_regex(values, r"^\s*$")
    found: Failures = {row: ("value is empty", "empty_value") for row in pc.indices_nonzero(empty).to_pylist()}
    try:
        values.cast(pa.string())  # validates UTF-8 for the whole chunk at once
    except pa.ArrowInvalid:
        found.update(_not_utf8(values))
    return found


def _not_utf8(values: pa.Array) -> Failures:
    found = {}
    for row, value in enumerate(values.to_pylist()):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"invalid JSON: value is not UTF-8 (byte 0x{value[exc.start]:02x} at position {exc.start})"
            found[row] = (reason, "invalid_json")
    return found


def _read_json(values: pa.Array, value_schema: pa.Schema | None) -> pa.Table:
    """Parse one JSON object per value; fail unless every value gave exactly one row."""
    payload = _joined(values)
    table = _parse(payload, len(values))
    text = _timestamp_paths(table.schema, value_schema)
    if _holds_big_doubles(table):
        table = _exact_integers(table, values, payload, text)
    elif text:
        table = _parse(payload, len(values), _with_types(table.schema, text))
    table = without_empty_structs(table)
    if value_schema is not None:
        try:
            table = apply_declared(table, value_schema)
        except DoesNotFit as exc:
            raise _ParseFailure(str(exc), "schema_mismatch") from None
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


def _timestamp_paths(schema: pa.Schema, declared: pa.Schema | None) -> dict[Path, pa.DataType]:
    """Fields read as timestamps from strings, mapped to string; declared timestamps and dates stay."""
    paths: dict[Path, pa.DataType] = {}
    for f in schema:
        if declared is not None and (f.name not in declared.names or is_temporal(declared.field(f.name).type)):
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


# (start, end, table) per parsed run, (i, i + 1, (reason, kind)) per bad value
Parts = list[tuple[int, int, pa.Table | tuple[str, str]]]


def _parse_segments(values: pa.Array, value_schema: pa.Schema | None) -> Parts:
    try:
        return _bisect(values, value_schema, _ConflictBudget())
    except _TooManyConflicts:
        quoted = quote_mixed(values.to_pylist())
    return _bisect(values if quoted is None else pa.array(quoted, pa.binary()), value_schema, None)


def _bisect(values: pa.Array, value_schema: pa.Schema | None, budget: _ConflictBudget | None) -> Parts:
    try:
        return [(0, len(values), _read_json(values, value_schema))]
    except _ParseFailure as exc:
        failure = exc
    if len(values) == 1:
        return [(0, 1, _parse_alone(values[0].as_py(), value_schema, failure))]
    if budget is not None:
        budget.spend(str(failure))
    mid = len(values) // 2
    left = _bisect(values.slice(0, mid), value_schema, budget)
    right = _bisect(values.slice(mid), value_schema, budget)
    return left + [(s + mid, e + mid, t) for s, e, t in right]


def _parse_alone(value: bytes, value_schema: pa.Schema | None, failure: _ParseFailure) -> pa.Table | tuple[str, str]:
    """One value that failed: if it is JSON whose arrays mix kinds (`[1, {"a": 2}]`), the lattice
    types the mixed values as text (`["1", "{\\"a\\":2}"]`); anything else is a bad record."""
    quoted = quote_mixed([value])
    if quoted is not None:
        try:
            return _read_json(pa.array(quoted, pa.binary()), value_schema)
        except _ParseFailure as exc:
            failure = exc
    return _reason(str(failure)), failure.kind


def _reason(message: str) -> str:
    """One readable line: Arrow's parse errors name a row of the chunk, which means nothing here."""
    first_line = message.split("\n")[0].strip()
    if first_line.startswith("JSON parse error: "):
        return "invalid JSON: " + re.sub(r"\s+in row \d+$", "", first_line.removeprefix("JSON parse error: "))
    return first_line
