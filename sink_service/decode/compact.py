"""In-file compaction (SINK_COMPACT_FILES): a file holds only the latest row of each primary key.

The endpoint keeps, per primary key, the row with the highest order value among the rows it
processes together. Rows of a file that a later row of the same key overrides therefore never
change the end state, so they need not be uploaded (Flink's upsert buffer does the same). The
latest row is the one with the highest order value; of rows with equal order values, the later
one in the file (the higher offset), so the result equals the endpoint's for any order column.
A null order value loses to any value. Without primary keys nothing is compacted.

`compact` works on whole columns: one stable sort of the order column gives every row its rank,
and a hash `group_by` on the keys takes each key's highest rank. Kept rows stay in offset order.

Files are written a row group at a time, so a key can recur in a later row group of the same
file. `FileCompactor` handles that for `PartitionFileWriter`:
- each row group is compacted in memory before it is written (with the default sizes a file is
  usually one row group, and then this is all it takes);
- the key and order columns of the rows written are remembered;
- when the file is closed and some key appears in two row groups, the file is rewritten a row
  group at a time without the overridden rows (read one, filter it, write it).
Memory: the key and order columns of the rows already in the open file (about 20 bytes a row for
short keys and `_offset`), never the file itself: a task still holds one row group at a time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_RANK = "__rank"


def latest_rows(table: pa.Table, primary_keys: Sequence[str], order_column: str) -> pa.Array:
    """Indices, ascending, of the latest row of each key in `table` (rows in offset order)."""
    rows = table.num_rows
    if not primary_keys or rows < 2:
        return pa.array(np.arange(rows))
    by_order = pc.array_sort_indices(table.column(order_column), null_placement="at_start")  # stable
    rank = np.empty(rows, dtype=np.int64)
    rank[by_order.to_numpy()] = np.arange(rows)
    keys = table.select(list(primary_keys)).append_column(_RANK, pa.array(rank))
    best = keys.group_by(list(primary_keys), use_threads=False).aggregate([(_RANK, "max")])
    return pa.array(np.sort(by_order.take(best.column(f"{_RANK}_max")).to_numpy()))


def compact(table: pa.Table, primary_keys: Sequence[str], order_column: str) -> pa.Table:
    """`table` with only the latest row of each primary key, in the original (offset) order."""
    kept = latest_rows(table, primary_keys, order_column)
    return table if len(kept) == table.num_rows else table.take(kept)


class FileCompactor:
    """Compaction of one Parquet file that is written a row group at a time (see the module doc)."""

    def __init__(self, primary_keys: Sequence[str], order_column: str):
        self._keys = tuple(primary_keys)
        self._order = order_column
        self._columns = list(dict.fromkeys((*primary_keys, order_column)))
        self._written: list[pa.Table] = []  # key and order columns of each row group written

    def row_group(self, rows: pa.Table) -> pa.Table:
        """The rows to write as the file's next row group: `rows`' latest per key."""
        rows = compact(rows, self._keys, self._order)
        self._written.append(rows.select(self._columns))
        return rows

    def finish(self, path: Path, compression: str | None) -> int:
        """Rewrite the closed file at `path` without rows that a later row group overrides;
        return the rows it holds. Ready for the next file afterwards."""
        written, self._written = self._written, []
        total = sum(t.num_rows for t in written)
        if len(written) < 2:
            return total
        kept = latest_rows(pa.concat_tables(written), self._keys, self._order)
        if len(kept) == total:
            return total
        _rewrite(path, kept, total, compression)
        return len(kept)

    def reset(self) -> None:
        """Forget the open file (it was abandoned)."""
        self._written = []


def _rewrite(path: Path, kept: pa.Array, rows: int, compression: str | None) -> None:
    """Replace the file at `path` by its rows at the indices `kept`, one row group at a time."""
    mask = np.zeros(rows, dtype=bool)
    mask[kept.to_numpy()] = True
    temporary = path.with_name(path.name + ".compacting")
    start = 0
    try:
        with pq.ParquetFile(path) as source, pq.ParquetWriter(temporary, source.schema_arrow,
                                                              compression=compression) as writer:
            for index in range(source.num_row_groups):
                group = source.read_row_group(index)
                keep = mask[start:start + group.num_rows]
                start += group.num_rows
                if keep.any():
                    group = group.filter(pa.array(keep))
                    writer.write_table(group, row_group_size=group.num_rows)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)
