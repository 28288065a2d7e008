"""Turn an uploaded Parquet table into the rows an upsert writes, rejecting what EMS would reject.

Everything here runs outside the store's write lock, so concurrent uploads convert in parallel
while another one is being written.
"""

from __future__ import annotations

import pyarrow as pa

from local_ems.dedupe import latest_per_key
from local_ems.params import PushParams
from local_ems.responses import HttpError
from local_ems.store import PreparedRows
from local_ems.values import declared_type, is_nested, normalize, to_rows


def prepare(table: pa.Table, params: PushParams) -> PreparedRows:
    """Validated, normalized, deduplicated rows; HttpError(400) naming the offending column."""
    names = table.column_names
    _check_column_names(names)
    missing = [key for key in params.primary_keys if key not in names]
    if missing:
        raise HttpError(400, f"primary key column(s) {', '.join(missing)} missing from the Parquet file; "
                             f"it has columns {', '.join(names)}")
    if params.order_column is not None and params.order_column not in names:
        raise HttpError(400, f"duplicateRemovalOrderColumn {params.order_column} is missing from the Parquet "
                             f"file; it has columns {', '.join(names)}")
    table = normalize(table)
    for key in params.primary_keys:
        column = table.column(key)
        if is_nested(column.type):
            raise HttpError(400, f"primary key column {key} has type {column.type}, which cannot be a key")
        if column.null_count:
            raise HttpError(400, f"primary key column {key} has {column.null_count} null value(s)")
    if params.primary_keys:
        try:
            table = latest_per_key(table, params.primary_keys, params.order_column)
        except pa.ArrowException as error:
            raise HttpError(400, f"cannot order the rows by the primary key and order column: {error}") from error
    try:
        rows = to_rows(table)
    except (TypeError, ValueError, OverflowError) as error:
        raise HttpError(400, f"a value cannot be stored: {error}") from error
    return PreparedRows(
        target_name=params.target_name,
        columns=tuple(names),
        declared_types=tuple(declared_type(column.type) for column in table.columns),
        rows=rows,
        primary_keys=params.primary_keys,
        order_column=params.order_column,
    )


def _check_column_names(names: list[str]) -> None:
    if not names:
        raise HttpError(400, "the Parquet file has no columns")
    seen: dict[str, str] = {}
    for name in names:
        if not name or "\x00" in name:
            raise HttpError(400, f"column name {name!r} is empty or contains a NUL character")
        folded = name.casefold()
        if folded in seen:
            raise HttpError(400, f"columns {seen[folded]!r} and {name!r} collide; column names are case-insensitive")
        seen[folded] = name
