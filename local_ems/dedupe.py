"""Keep one row per primary key inside a file: the one with the highest order value.

Doing this in Arrow before SQLite sees the rows gives the same result as applying the rows one by one
with the conditional upsert, but sends each key to SQLite once, and in key order, which makes the
B-tree inserts about 1.5x faster than in file order.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

_ROW_NUMBER = "__local_ems_row_number__"


def latest_per_key(table: pa.Table, keys: Sequence[str], order_column: str | None) -> pa.Table:
    """Rows sorted by key, one per key: the highest order value wins; nulls lose; ties keep the first.

    Without an order column the last row of a key in the file wins, as if the rows were applied in
    file order. Key columns must not contain nulls (the caller checks).
    """
    if table.num_rows <= 1:
        return table
    ranked = table
    if order_column is None:
        order_column = _ROW_NUMBER
        ranked = table.append_column(_ROW_NUMBER, pa.array(range(table.num_rows), pa.int64()))
    sort_keys = [(key, "ascending") for key in keys] + [(order_column, "descending")]
    indices = pc.sort_indices(ranked, sort_keys=sort_keys)  # Arrow's default puts nulls last, either order
    ordered = table.take(indices)
    first_of_key: pa.Array | None = None
    for key in keys:
        column = ordered.column(key).combine_chunks()
        changed = pc.not_equal(column.slice(1), column.slice(0, len(column) - 1))
        first_of_key = changed if first_of_key is None else pc.or_(first_of_key, changed)
    assert first_of_key is not None
    mask = pa.concat_arrays([pa.array([True]), first_of_key.cast(pa.bool_())])
    return ordered.filter(mask)
