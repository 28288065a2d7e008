"""Flat rows for relational targets: nested objects become `parent_child` columns.

EMS tables are flat and relational; like the reference connector (by default), nested objects are
spread into columns, and arrays are kept as JSON text or dropped:

    {"id": 1, "customer": {"name": "Ann", "address": {"zip": "1010"}}, "tags": ["a", "b"]}
    -> id=1, customer_name="Ann", customer_address_zip="1010", tags='["a","b"]'

- Names: in each step of a field's path every character outside `[A-Za-z0-9_]` becomes `_`; the
  steps are joined by `_` (`Größe` -> `Gr__e`, `a.b` -> `a_b`), then lowercased with
  `lowercase` (SINK_LOWERCASE_FIELDS). A name that would be empty is `_`.
- A null object makes all its columns null in that row.
- Arrays (and any other collection type) become compact JSON: objects without their null fields
  (absent and null mean the same, as in the lattice's `json_text`), `null` elements kept, numbers
  as Arrow writes them (`1.5`, `1e+16`), strings escaped as JSON requires. A null array stays
  null. With `discard_collections` (SINK_FLATTEN_DISCARD_COLLECTIONS) the column is dropped.
- Decimals become doubles with `decimals_as_double` (SINK_DECIMALS_AS_DOUBLE), as EMS tables
  expect: exact to about 15 significant digits, so a larger integer key loses digits.
- Metadata columns (`metadata`: `_key`, `_offset`, ...) pass unchanged.

Collisions. Two fields can become one name (`a.b` and `a_b`; `Id` and `id` when lowercasing).
They share that column, their types joined by the widening lattice. This is what happens anyway
when the two fields arrive in different chunks (each chunk then holds one of them under that
name), so sharing keeps the result independent of how records are chunked. A record that holds
values in two such fields cannot be written without losing one. That is the record's fault, not
the topic's configuration (a column name alone says nothing about other records), so
`FieldCollision` lists each such row as a bad record (`field_collision`) naming both fields and
the column; a field that would become a metadata column's name may never fill it
(`reserved_field`), as with a top-level value field of that name. The caller rejects those rows
under SINK_ERROR_POLICY and flattens the rest, which then cannot collide.

Everything works on whole columns (pyarrow.compute); the JSON of arrays is built with string
kernels too. Only rare element types (timestamps, dates, binary inside arrays) are written by
Python, value by value.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc

from sink_service.decode.bad_records import Failures
from sink_service.shared.column_names import column_name
from uploader.column_types import _map_list, json_text, unify

_NOT_CONTROL = bytes(range(0x20, 0x100))  # bytes a JSON string may hold unescaped (but `"` and `\`)
_TEXT = pa.string()


class FieldCollision(ValueError):
    """Rows that cannot be flattened: `failures` maps each (its index in the table given to
    `flatten`) to (reason, kind), as `bad_records` takes them. The table without these rows
    flattens without error."""

    def __init__(self, failures: Failures):
        self.failures = failures
        row, (reason, _) = next(iter(failures.items()))
        super().__init__(f"{len(failures)} row(s) cannot be flattened, e.g. row {row}: {reason}")


@dataclass(frozen=True)
class _Leaf:
    path: tuple[str, ...]
    values: pa.ChunkedArray
    metadata: bool = False


def flatten(
    table: pa.Table,
    *,
    metadata: Collection[str],
    discard_collections: bool,
    lowercase: bool,
    decimals_as_double: bool,
) -> pa.Table:
    """`table` with one column per leaf field (see the module doc); raises `FieldCollision`."""
    columns: dict[str, list[_Leaf]] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name in metadata:
            columns.setdefault(name, []).append(_Leaf((name,), column, metadata=True))
            continue
        for leaf in _leaves((name,), column, discard_collections, decimals_as_double):
            columns.setdefault(column_name(leaf.path, lowercase=lowercase), []).append(leaf)
    failures: Failures = {}
    for name, leaves in columns.items():
        if len(leaves) > 1:
            for row, failure in _clashes(name, leaves).items():
                failures.setdefault(row, failure)
    if failures:
        raise FieldCollision(dict(sorted(failures.items())))
    return pa.table({name: _shared(leaves) for name, leaves in columns.items()})


def _leaves(path: tuple[str, ...], column: pa.ChunkedArray, discard_collections: bool,
            decimals_as_double: bool) -> Iterator[_Leaf]:
    type_ = column.type
    if pa.types.is_struct(type_):
        for index, field in enumerate(type_):
            # struct_field nulls a child wherever its parent is null
            child = pc.struct_field(column, [index])
            yield from _leaves((*path, field.name), child, discard_collections, decimals_as_double)
    elif pa.types.is_nested(type_):
        if not discard_collections:
            yield _Leaf(path, pa.chunked_array([_json(chunk) for chunk in column.chunks], _TEXT))
    elif decimals_as_double and pa.types.is_decimal(type_):
        yield _Leaf(path, column.cast(pa.float64()))
    else:
        yield _Leaf(path, column)


def _clashes(name: str, leaves: list[_Leaf]) -> Failures:
    """Rows where fields sharing the column `name` cannot share it."""
    fields = [leaf for leaf in leaves if not leaf.metadata]
    if len(fields) < len(leaves):  # a value field would fill a metadata column
        failures: Failures = {}
        for leaf in fields:
            reason = f"field {_shown(leaf.path)} becomes column `{name}` when flattened, which is a metadata column"
            for row in pc.indices_nonzero(pc.is_valid(leaf.values)).to_pylist():
                failures.setdefault(row, (reason, "reserved_field"))
        return failures
    held = reduce(pc.add, (pc.is_valid(leaf.values).cast(pa.int8()) for leaf in fields))
    shown = ", ".join(_shown(leaf.path) for leaf in fields[:-1]) + " and " + _shown(fields[-1].path)
    every = "both" if len(fields) == 2 else "all"
    reason = f"fields {shown} {every} become column `{name}` when flattened; a record may hold only one of them"
    return {row: (reason, "field_collision") for row in pc.indices_nonzero(pc.greater(held, 1)).to_pylist()}


def _shown(path: tuple[str, ...]) -> str:
    """A field's path as users write it (`customer.address.zip`); odd steps quoted."""
    return "`" + ".".join(s if s and "." not in s and "`" not in s else json.dumps(s) for s in path) + "`"


def _shared(leaves: list[_Leaf]) -> pa.ChunkedArray:
    """One column from fields of which each row holds at most one (checked by `_clashes`)."""
    if len(leaves) == 1:
        return leaves[0].values
    if any(leaf.metadata for leaf in leaves):  # the value fields are null in every row
        return next(leaf.values for leaf in leaves if leaf.metadata)
    tables = unify(pa.table({"v": leaf.values.combine_chunks()}) for leaf in leaves)
    columns = [t.column("v") for t in tables]
    return columns[0] if pa.types.is_null(columns[0].type) else pc.coalesce(*columns)


def _json(values: pa.Array) -> pa.Array:
    """Compact JSON text of each value (see the module doc); null stays null."""
    type_ = values.type
    if pa.types.is_null(type_):
        return pa.nulls(len(values), _TEXT)
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return _quoted(values.cast(_TEXT))
    if (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)
            or pa.types.is_boolean(type_)):
        return values.cast(_TEXT)
    if pa.types.is_struct(type_):
        return _json_object(values)
    if pa.types.is_list(type_):
        return _json_list(values)
    return pa.array([None if v is None else json_text(v) for v in values.to_pylist()], _TEXT)


def _quoted(strings: pa.Array) -> pa.Array:
    escaped = pc.replace_substring(pc.replace_substring(strings, "\\", "\\\\"), '"', '\\"')
    for char in _control_characters(escaped):  # as json.dumps writes them: \n, \t, ..., else \u00XX
        escaped = pc.replace_substring(escaped, char, json.dumps(char)[1:-1])
    return pc.binary_join_element_wise('"', escaped, '"', "")


def _control_characters(strings: pa.Array) -> set[str]:
    """The characters below U+0020 in `strings` (a superset: the whole data buffer is looked at).

    One C-speed pass over the bytes; UTF-8 never uses bytes below 0x80 inside a multi-byte character.
    """
    data = strings.buffers()[2]
    return set() if data is None else set(data.to_pybytes().translate(None, _NOT_CONTROL).decode())


def _json_object(struct: pa.StructArray) -> pa.Array:
    # Each present field as `,"name":value`, an absent one as "": the fields join without a
    # separator and the first comma is cut. (null_handling="skip" would skip the absent ones, but
    # pyarrow 26 then drops the rows where every field is absent.)
    members = [
        pc.binary_join_element_wise(
            "," + json.dumps(field.name, ensure_ascii=False) + ":", _json(pc.struct_field(struct, [index])), "",
        ).fill_null("")
        for index, field in enumerate(struct.type)
    ]
    body = pc.binary_join_element_wise(*members, "") if members else pa.nulls(len(struct), _TEXT).fill_null("")
    text = pc.binary_join_element_wise("{", pc.utf8_slice_codeunits(body, 1), "}", "")
    return text if not struct.null_count else pc.if_else(struct.is_valid(), text, pa.scalar(None, _TEXT))


def _json_list(values: pa.ListArray) -> pa.Array:
    elements = _map_list(values, lambda items: _json(items).fill_null("null"))
    return pc.binary_join_element_wise("[", pc.binary_join(elements, ","), "]", "")
