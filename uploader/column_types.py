"""The widening lattice: the one type that holds every value a field has arrived with.

It is the contract of the files' column types: the decoder types every file by it, and a target
that keeps a typed table (Delta) widens the table by the same rules, so it lives here, below both.

JSON does not type its fields, so one field can arrive as a number in one record and as a string
in the next. Rows are never split by type or dropped for it; the field's type is instead widened
to the least type that holds both values exactly (`join`), and values are converted to it
(`convert`):

    null     < any type             a null carries no value (nor its type)
    int64    < double               when the integer has an exact double (|v| <= 2**53)
    int64    < decimal(38,0)        integers beyond int64 arrive as decimal(38,0)
    struct   + struct  -> struct    the union of the fields, each field joined recursively
    list<a>  + list<b> -> list<a + b>
    anything else      -> string    e.g. decimal with double, bool with a number, a number with
                                    a string, a struct or list with a scalar, a struct with a list

Converting to string keeps the value's JSON text: numbers as their digits (doubles in their
shortest round-trip form, e.g. `1e+16`), booleans as `true`/`false`, structs and lists as
compact JSON (fields that are null are left out, as absent and null mean the same here).
A value with no exact home in the joined type (an integer beyond 2**53 for a double, a decimal
that overflows) makes that field a string instead: the join is the least *type*, the conversion
is what guarantees that no value changes. Other distinct types (e.g. a timestamp beside a date)
join to string as well; integers of other widths and floats join as the numbers they are.
A value already made text stays that text: an array mixing kinds (`[1, "a"]`, typed by
`sink_service.decode.json_paths` as the list `["1", "a"]`) joined with a scalar is `["1","a"]`.
"""

from __future__ import annotations

import base64
import decimal
import json
from collections.abc import Callable, Iterable
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc

_TEXT = pa.string()
_DECIMAL = pa.decimal128(38, 0)
_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


def join(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The least type of the lattice that holds values of both `a` and `b`."""
    if a == b or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return pa.struct(_join_fields(list(a), list(b)))
    if pa.types.is_list(a) and pa.types.is_list(b):
        return pa.list_(a.value_field.with_type(join(a.value_type, b.value_type)))
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return _join_integers(a, b)
    if _is_binary_number(a) and _is_binary_number(b):
        return pa.float64()
    if _is_exact(a) and _is_exact(b):
        return pa.decimal128(38, max(getattr(a, "scale", 0), getattr(b, "scale", 0)))
    return _TEXT


def join_schemas(a: pa.Schema, b: pa.Schema) -> pa.Schema:
    """Fields of `a` in order, each joined with `b`'s field of that name, then `b`'s new fields."""
    return pa.schema(_join_fields(list(a), list(b)))


def _join_fields(a: list[pa.Field], b: list[pa.Field]) -> list[pa.Field]:
    others = {f.name: f for f in b}
    joined = []
    for field in a:
        other = others.pop(field.name, None)
        joined.append(field if other is None else _with_type(field, join(field.type, other.type)))
    return joined + list(others.values())


def _with_type(field: pa.Field, type_: pa.DataType) -> pa.Field:
    return field if field.type == type_ else field.with_type(type_)


def _join_integers(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    if pa.types.is_signed_integer(a) == pa.types.is_signed_integer(b):
        return a if a.bit_width >= b.bit_width else b
    unsigned = b if pa.types.is_signed_integer(a) else a
    return pa.int64() if unsigned.bit_width < 64 else _DECIMAL


def _is_binary_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_exact(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_decimal(t)


def convert(array: pa.Array, target: pa.DataType) -> pa.Array:
    """`array`'s values as `join(target, array.type)`, or wider where a value needs it; never altered.

    Struct fields come in `target`'s order, then the array's new ones: JSON objects name their fields in
    any order, and a struct of the same fields in another order must fit a file's or a table's type."""
    target = join(target, array.type)
    if array.type == target:
        return array
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), target)
    if target == _TEXT:
        return _as_text(array)
    if pa.types.is_struct(target):
        return _convert_struct(array, target)
    if pa.types.is_list(target):
        return _convert_list(array, target)
    try:
        return array.cast(target, safe=True)
    except _CAST_ERRORS:  # no exact value in the joined type (e.g. 2**53 + 1 as a double)
        return _as_text(array)


def _convert_struct(array: pa.StructArray, target: pa.StructType) -> pa.Array:
    children = []
    for field in target:
        index = array.type.get_field_index(field.name)
        child = array.field(index) if index >= 0 else pa.nulls(len(array), field.type)
        children.append(convert(child, field.type))
    return _rebuild_struct(array, list(target), children)


def _convert_list(array: pa.ListArray, target: pa.ListType) -> pa.Array:
    return _map_list(array, lambda values: convert(values, target.value_type))


def _rebuild_struct(array: pa.StructArray, fields: list[pa.Field], children: list[pa.Array]) -> pa.Array:
    """A struct with `array`'s nulls, of these children (each field takes its child's type)."""
    fields = [_with_type(f, c.type) for f, c in zip(fields, children, strict=True)]
    mask = array.is_null() if array.null_count else None
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def _map_list(array: pa.ListArray, function: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """`array` with `function` applied to the values its lists hold (lengths and nulls kept)."""
    offsets = array.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    values = function(array.values.slice(start, end - start))
    mask = array.is_null() if array.null_count else None
    relative = pc.subtract(offsets, pa.scalar(start, pa.int32()))
    list_type = pa.list_(_with_type(array.type.value_field, values.type))
    return pa.ListArray.from_arrays(relative, values, type=list_type, mask=mask)


def _as_text(array: pa.Array) -> pa.Array:
    """Each value's JSON text (strings stay as they are)."""
    if pa.types.is_struct(array.type) or pa.types.is_list(array.type):
        return pa.array([None if v is None else json_text(v) for v in array.to_pylist()], _TEXT)
    return array.cast(_TEXT)


def json_text(value: object) -> str:
    """Compact JSON text of a Python value, as the lattice writes structs and lists into strings."""
    return json.dumps(_without_nulls(value), ensure_ascii=False, separators=(",", ":"), default=_json_default)


def _without_nulls(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _json_default(value: object) -> object:
    """Decimals of scale 0 as JSON integers; other non-JSON values (dates, timestamps) as text."""
    if isinstance(value, decimal.Decimal) and value == value.to_integral_value():
        return int(value)
    return str(value)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` under `schema`: columns converted (wider where a value needs it), missing ones null.

    Columns that `schema` lacks follow at the end. The result's schema equals `schema` exactly
    when the table fits it; otherwise it is wider, never narrower.
    """
    columns, fields = [], []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, field.type))
            fields.append(field)
            continue
        column = table.column(field.name)
        if column.type != field.type:
            column = convert(column.combine_chunks(), field.type)
        columns.append(column)
        fields.append(_with_type(field, column.type))
    for field in table.schema:
        if field.name not in schema.names:
            columns.append(table.column(field.name))
            fields.append(field)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def unify(tables: Iterable[pa.Table], schema: pa.Schema | None = None) -> list[pa.Table]:
    """The tables under one common schema: the join of theirs (and of `schema`), widened until every value fits."""
    tables = list(tables)
    schemas = [t.schema for t in tables]
    schema = reduce(join_schemas, schemas if schema is None else [schema, *schemas])
    while True:
        fitted = [conform(t, schema) for t in tables]
        wider = reduce(join_schemas, (t.schema for t in fitted), schema)
        if wider == schema:
            return fitted
        schema = wider


def without_empty_structs(table: pa.Table) -> pa.Table:
    """`table` without its field-less structs (recursively): they hold no value, and Parquet
    cannot store them. A column that is such a struct is left out; inside a list, such an object
    becomes a null element, so the list keeps its length.
    """
    if not any(_has_empty_struct(f.type) for f in table.schema):
        return table
    for name in table.column_names:
        column = _without_empty(table.column(name).combine_chunks())
        index = table.schema.get_field_index(name)
        # Dropped, not rebuilt: a table rebuilt from no columns would have no rows either.
        table = table.remove_column(index) if column is None else table.set_column(index, name, column)
    return table


def _has_empty_struct(type_: pa.DataType) -> bool:
    if pa.types.is_struct(type_):
        return type_.num_fields == 0 or any(_has_empty_struct(f.type) for f in type_)
    return pa.types.is_list(type_) and _has_empty_struct(type_.value_type)


def _without_empty(array: pa.Array) -> pa.Array | None:
    """`array` without field-less structs; None when nothing is left."""
    if not _has_empty_struct(array.type):
        return array
    if pa.types.is_list(array.type):
        return _map_list(array, _empty_as_null)
    kept = [(field, _without_empty(array.field(i))) for i, field in enumerate(array.type)]
    kept = [(field, child) for field, child in kept if child is not None]
    if not kept:
        return None
    return _rebuild_struct(array, [f for f, _ in kept], [c for _, c in kept])


def _empty_as_null(values: pa.Array) -> pa.Array:
    kept = _without_empty(values)
    return pa.nulls(len(values)) if kept is None else kept


def encode_schema(schema: pa.Schema | None) -> str:
    """A schema as text, to travel in JSON and Spark rows (the planner hints' column types)."""
    return "" if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()


def decode_schema(text: str) -> pa.Schema | None:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))) if text else None
