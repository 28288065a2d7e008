"""Arrow columns -> values SQLite can store, and the column type each one is declared with.

Mapping (the local endpoint's choice; EMS itself stores typed columns):
- integers, durations -> INTEGER; floats -> REAL; decimals -> TEXT holding their exact digits
  (`12345678901234567890`, `12.50`): a decimal(38,0) key beyond int64 must stay distinct;
- bool -> BOOLEAN (stored 0/1, read back as bool); strings -> TEXT; binary -> BLOB;
- timestamps -> TEXT, ISO 8601 with the column's own precision (`2024-05-01T12:00:00.123`); zoned
  timestamps are converted to UTC and end in `Z`. Fixed width per column, so an order column of
  timestamps still compares correctly as text. Dates and times -> ISO TEXT as well;
- struct, list and map values -> TEXT holding compact JSON (maps become objects);
- dictionary-encoded columns are decoded first.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S"  # Arrow's %S carries the unit's fractional digits


def normalize(table: pa.Table) -> pa.Table:
    """The same table with every column in a type whose Python values SQLite can bind."""
    return pa.table({name: _normalize(column) for name, column in zip(table.column_names, table.columns,
                                                                        strict=True)})


def declared_type(arrow_type: pa.DataType) -> str:
    """SQLite declared type for a column that `normalize` produced."""
    if pa.types.is_boolean(arrow_type):
        return "BOOLEAN"
    if pa.types.is_integer(arrow_type):
        return "INTEGER"
    if pa.types.is_floating(arrow_type):
        return "REAL"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) \
            or pa.types.is_fixed_size_binary(arrow_type) or pa.types.is_binary_view(arrow_type):
        return "BLOB"
    if pa.types.is_null(arrow_type):
        return ""
    return "TEXT"  # strings, and nested values as JSON


def is_nested(arrow_type: pa.DataType) -> bool:
    return pa.types.is_nested(arrow_type)


def to_rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """Row tuples for executemany; column-wise conversion is several times faster than to_pylist()."""
    columns = [_python_values(column) for column in table.columns]
    return list(zip(*columns, strict=True)) if columns else []


def _normalize(column: pa.ChunkedArray) -> pa.ChunkedArray:
    arrow_type = column.type
    if isinstance(arrow_type, pa.ExtensionType):
        return _normalize(pa.chunked_array([chunk.storage for chunk in column.chunks], arrow_type.storage_type))
    if pa.types.is_dictionary(arrow_type):
        return _normalize(column.cast(arrow_type.value_type))
    if pa.types.is_timestamp(arrow_type):
        if arrow_type.tz is None:
            return pc.strftime(column, format=_TIMESTAMP_FORMAT)
        return pc.strftime(column.cast(pa.timestamp(arrow_type.unit, "UTC")), format=_TIMESTAMP_FORMAT + "Z")
    if pa.types.is_date(arrow_type) or pa.types.is_time(arrow_type):
        return column.cast(pa.string())
    if pa.types.is_decimal(arrow_type):
        return column.cast(pa.string())
    if pa.types.is_float16(arrow_type):
        return column.cast(pa.float64())
    if pa.types.is_duration(arrow_type):
        return column.cast(pa.int64())
    return column


def _python_values(column: pa.ChunkedArray) -> list[Any]:
    if not is_nested(column.type):
        return column.to_pylist()
    return [None if value is None else json.dumps(value, default=_json_default, ensure_ascii=False,
                                                  separators=(",", ":"))
            for value in column.to_pylist(maps_as_pydicts="lossy")]


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} cannot be stored as JSON")
