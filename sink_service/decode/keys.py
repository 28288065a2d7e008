"""The Kafka key of each record: the `_key` column, and with SINK_KEY_FORMAT=json its fields.

- `string` (default): `_key` is the key's text; bytes that are not UTF-8 are kept as `\\xNN`.
- `raw`: `_key` is the key's bytes, as they came.
- `json`: the key is a JSON object whose fields become columns, named with SINK_KEY_FIELDS_PREFIX
  in front; `_key` is its text. A key that is not a JSON object is a bad record (`invalid_key`);
  a record without a key has null key fields.
- `avro`, `protobuf`: the key is framed for the schema registry (`registry.py`) and decoded like
  such values; its fields become columns as a JSON key's do, and `_key` holds its bytes. A key
  that does not decode is a bad record of the decoder's kind (`invalid_avro`, `unknown_schema_id`).

A key field and a value field with the same name share one column, and the value wins: a record
whose value holds the field (not null) keeps the value's, one whose value lacks it takes the
key's. Types are joined by the widening lattice, so no value changes.

With a structured key (json, avro, protobuf) and no SINK_PRIMARY_KEYS, the key's fields are the primary keys. They
are learned from the first record with a key (as the columns they are written as, flattened names
included, sorted, so every file of a topic names them alike), and every later key of the range
must have exactly those fields, each a scalar: a key with other fields is a bad record
(`invalid_key`), one lacking a field a `missing_key` one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sink_service.decode.bad_records import Failures
from sink_service.decode.json_values import ParsedValues, parse_objects
from uploader.column_types import convert, join

KEY_FORMATS = ("string", "json", "raw", "avro", "protobuf")
STRUCTURED_KEY_FORMATS = ("json", "avro", "protobuf")  # keys whose fields become columns


def key_column(keys: pa.Array, key_format: str) -> pa.Array:
    """The `_key` column: the key's bytes for `raw` and the registry formats, else its text."""
    if key_format in ("raw", "avro", "protobuf"):
        return keys
    try:
        return keys.cast(pa.string())
    except pa.ArrowInvalid:
        # Not UTF-8: keep every key, escaping the bytes that are not text.
        return pa.array(
            [None if k is None else k.decode("utf-8", "backslashreplace") for k in keys.to_pylist()],
            pa.string(),
        )


@dataclass(frozen=True)
class KeyFields:
    table: pa.Table  # the key's fields, prefixed, row for row with the keys
    failures: Failures


def key_fields(keys: pa.Array, prefix: str, parse: Callable[[pa.Array], ParsedValues] | None = None) -> KeyFields:
    """The fields of the keys as columns named `prefix + field`; null keys give null fields.

    `parse`: the keys' decoder (binary, no nulls, to rows); None for JSON objects."""
    where = None  # positions of the keys given to the parser, when some are null
    given = keys
    if keys.null_count:
        present = pc.is_valid(keys)
        where, given = np.flatnonzero(present.to_numpy(zero_copy_only=False)), keys.filter(present)
    parsed = parse_objects(given) if parse is None else parse(given)
    failures = {row if where is None else int(where[row]): _key_failure(reason, kind, json=parse is None)
                for row, (reason, kind) in parsed.failures.items()}
    if parsed.table is None:
        return KeyFields(no_columns(len(keys)), failures)
    table = parsed.table.rename_columns([prefix + name for name in parsed.table.column_names])
    if where is None and parsed.rows is None:
        return KeyFields(table, failures)
    rows = np.arange(len(given)) if parsed.rows is None else parsed.rows.to_numpy()
    rows = rows if where is None else where[rows]
    index = np.full(len(keys), -1)
    index[rows] = np.arange(table.num_rows)
    return KeyFields(table.take(pa.array(index, mask=index < 0)), failures)


def _key_failure(reason: str, kind: str, *, json: bool) -> tuple[str, str]:
    return (f"key is not a JSON object: {reason}", "invalid_key") if json else (f"key: {reason}", kind)


def no_columns(rows: int) -> pa.Table:
    """A table of `rows` rows and no columns (Arrow builds one only by dropping a column)."""
    return pa.table({"_": pa.nulls(rows)}).drop_columns(["_"])


def with_key_fields(fields: pa.Table, values: pa.Table) -> pa.Table:
    """The key's fields, then the value's; where both have a name, the value's wins unless null."""
    if not fields.num_columns:
        return values
    columns, names = [], []
    for name in fields.column_names:
        column = fields.column(name)
        if name in values.column_names:
            value = values.column(name)
            type_ = join(value.type, column.type)
            column = pc.coalesce(convert(value.combine_chunks(), type_), convert(column.combine_chunks(), type_))
        columns.append(column)
        names.append(name)
    for name in values.column_names:
        if name not in fields.column_names:
            columns.append(values.column(name))
            names.append(name)
    return pa.Table.from_arrays(columns, names=names)


def learned_primary_keys(fields: pa.Table) -> tuple[str, ...]:
    """The fields of the first key in `fields` that has any, sorted; () if no key has one."""
    with_fields = np.zeros(fields.num_rows, dtype=bool)
    for column in fields.columns:
        with_fields |= pc.is_valid(column).to_numpy(zero_copy_only=False)
    first = np.flatnonzero(with_fields)
    if not len(first):
        return ()
    return tuple(sorted(name for name in fields.column_names if fields.column(name)[int(first[0])].is_valid))


def unexpected_fields(fields: pa.Table, primary_keys: tuple[str, ...],
                      column: Callable[[str], str] = str) -> tuple[pa.Table, Failures]:
    """`fields` without those whose `column` (the name they are written as) is not a primary key:
    a key holding one, or a primary key field that is not a scalar, is a bad record."""
    failures: Failures = {}
    expected = ", ".join(primary_keys)
    kept = [name for name in fields.column_names if column(name) in primary_keys]
    for name in fields.column_names:
        values = fields.column(name)
        if name in kept and not _is_nested(values.type):
            continue
        reason = (f"key field `{name}` is an object or array; primary keys must be scalars" if name in kept
                  else f"key has a field `{name}`; this topic's keys have the fields {expected}")
        for row in pc.indices_nonzero(pc.is_valid(values)).to_pylist():
            failures.setdefault(row, (reason, "invalid_key"))
    return fields.select(kept), failures


def _is_nested(type_: pa.DataType) -> bool:
    return pa.types.is_struct(type_) or pa.types.is_list(type_)
