"""Kafka metadata as `_` columns after the record's fields (SINK_METADATA_COLUMNS).

`_key` (see `keys.py`), `_topic`, `_partition`, `_offset`, `_timestamp` (UTC, milliseconds) and
`_headers` (JSON, see `headers.py`). The order column and a primary key that is a metadata column
are written whether selected or not. `_offset` is always decoded, since files are named and
bounded by it; when it is not written the file writer leaves it out.

These names are reserved: a record whose value or key sets a field of one is a bad record
(`reserved_field`), whether or not the column is written.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from sink_service.decode.bad_records import Failures
from sink_service.decode.headers import headers_json
from sink_service.decode.keys import key_column
from sink_service.shared.column_names import METADATA_COLUMNS, OFFSET


def written_metadata(selected: Iterable[str], order_field: str, primary_keys: Iterable[str]) -> tuple[str, ...]:
    """The metadata columns written: those selected, the order column and metadata primary keys."""
    wanted = {*selected, order_field, *primary_keys}
    return tuple(name for name in METADATA_COLUMNS if name in wanted)


def split_reserved(fields: pa.Table, reserved: Iterable[str]) -> tuple[pa.Table, Failures]:
    """`fields` without those named like a reserved column; a row that sets one is a bad record."""
    names = [n for n in fields.column_names if n in set(reserved)]
    failures: Failures = {}
    for name in names:
        for row in pc.indices_nonzero(pc.is_valid(fields.column(name))).to_pylist():
            failures.setdefault(row, (f"record has a field `{name}`, which collides with a metadata column",
                                      "reserved_field"))
    return fields.drop_columns(names), failures


def with_metadata(fields: pa.Table, raw: pa.RecordBatch, written: tuple[str, ...], key_format: str) -> pa.Table:
    """`fields` with the metadata columns of its records (`raw`, row for row) appended: those
    `written`, and `_offset` in any case."""
    table = fields
    for name in METADATA_COLUMNS:
        if name in written or name == OFFSET:
            table = table.append_column(name, _column(name, raw, key_format))
    return table


def _column(name: str, raw: pa.RecordBatch, key_format: str) -> pa.Array:
    if name == "_key":
        return key_column(raw.column("key"), key_format)
    if name == "_timestamp":
        return raw.column("timestamp_ms").cast(pa.timestamp("ms", tz="UTC"))
    if name == "_headers":
        return headers_json(raw.column("headers"))
    return raw.column(name.removeprefix("_"))
