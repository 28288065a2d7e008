"""Tombstones: records whose value is null, Kafka's way of deleting a key (SINK_TOMBSTONES).

- `skip` (default): an upsert target cannot delete a row, so a tombstone is left out, counted as a
  bad record of kind `tombstone` and logged, but never stops the service, whatever
  SINK_ERROR_POLICY says: deleting is what the producer meant, not a fault.
- `fail`: a tombstone is a bad record under SINK_ERROR_POLICY (`fail` stops the service at it).
- `soft-delete`: a tombstone becomes a row holding its key fields, its metadata and
  `_deleted = true`; every other row has `_deleted = false`. The endpoint keeps the latest row per
  key, so that row says whether the key is deleted.
"""

from __future__ import annotations

import pyarrow as pa

from sink_service.decode.bad_records import Failures

TOMBSTONE_POLICIES = ("fail", "skip", "soft-delete")
DELETED = "_deleted"
_REASON = {
    "skip": "value is null (tombstone); skipped (SINK_TOMBSTONES=skip)",
    "fail": "value is null (tombstone); SINK_TOMBSTONES=fail makes it a bad record",
}


def tombstone_failures(tombstones: pa.RecordBatch, policy: str) -> Failures:
    """Each tombstone as a bad record of kind `tombstone` (`skip` and `fail`)."""
    return {row: (_REASON[policy], "tombstone") for row in range(tombstones.num_rows)}


def with_deleted(table: pa.Table, deleted: bool) -> pa.Table:
    """`table` with the `_deleted` column."""
    return table.append_column(DELETED, pa.repeat(pa.scalar(deleted), table.num_rows))
