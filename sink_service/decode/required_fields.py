"""Rows an upsert can place: every primary key field and the order field hold a value."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from sink_service.decode.bad_records import Failures


def missing_fields(table: pa.Table, primary_keys: tuple[str, ...], order_field: str) -> Failures:
    """Each row lacking a primary key or (with primary keys) an order value, as a `missing_key` bad record."""
    required = list(primary_keys)
    if primary_keys and order_field not in required:
        required.append(order_field)
    failures: Failures = {}
    for name in required:
        role = "primary key" if name in primary_keys else "order field"
        if name not in table.column_names:
            return {row: (f"{role} field `{name}` is missing", "missing_key") for row in range(table.num_rows)}
        for row in pc.indices_nonzero(pc.is_null(table.column(name))).to_pylist():
            failures.setdefault(row, (f"{role} field `{name}` is missing or null", "missing_key"))
    return failures
