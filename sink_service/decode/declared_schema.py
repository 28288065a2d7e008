"""SINK_VALUE_SCHEMA: values projected onto the declared fields, in the declared types.

A declared schema is a contract: a value whose field cannot be converted to its declared type
(`"many"` for an INT) does not fit, and the record is a bad record (`schema_mismatch`) under
the error policy; it never widens the column. Fields not declared are not written. A declared
STRING field holds the JSON text of any value, as Spark's JSON reader does.
"""

from __future__ import annotations

import pyarrow as pa

from uploader.column_types import convert


class DoesNotFit(Exception):
    """A value's field cannot be converted to its declared type."""


def is_temporal(type_: pa.DataType) -> bool:
    """Whether `type_` is (or holds) a timestamp or date: such declared fields parse ISO-8601 text."""
    if pa.types.is_struct(type_):
        return any(is_temporal(f.type) for f in type_)
    if pa.types.is_list(type_):
        return is_temporal(type_.value_type)
    return pa.types.is_timestamp(type_) or pa.types.is_date(type_)


def apply_declared(table: pa.Table, schema: pa.Schema) -> pa.Table:
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
            raise DoesNotFit(f"field `{declared.name}` is not a valid {declared.type}: {exc}") from None
    return pa.Table.from_arrays(columns, schema=schema)
