"""Kafka metadata as `_` columns beside the value's fields."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from sink_service.decode.bad_records import Failures
from sink_service.decode.keys import key_text

METADATA_COLUMNS = ("_key", "_topic", "_partition", "_offset", "_timestamp")


def split_reserved(values: pa.Table) -> tuple[pa.Table, Failures]:
    """`values` without fields named like a metadata column; a row that sets one is a bad record."""
    names = [n for n in values.column_names if n in METADATA_COLUMNS]
    failures: Failures = {}
    for name in names:
        for row in pc.indices_nonzero(pc.is_valid(values.column(name))).to_pylist():
            failures.setdefault(row, (f"value has a field `{name}`, which collides with a metadata column",
                                      "reserved_field"))
    return values.drop_columns(names), failures


def with_metadata(values: pa.Table, raw: pa.RecordBatch) -> pa.Table:
    """`values` with the metadata columns of its records (`raw`, row for row) appended."""
    columns = {
        "_key": key_text(raw.column("key")),
        "_topic": raw.column("topic"),
        "_partition": raw.column("partition"),
        "_offset": raw.column("offset"),
        "_timestamp": raw.column("timestamp_ms").cast(pa.timestamp("ms", tz="UTC")),
    }
    table = values
    for name, column in columns.items():
        table = table.append_column(name, column)
    return table
