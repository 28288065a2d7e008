"""Tombstones: records whose value is null, Kafka's way of deleting a key."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from sink_service.decode.bad_records import Failures

_REASON = "value is null (tombstone); deletes are not supported by upsert targets"


def tombstone_failures(values: pa.Array) -> Failures:
    """Each tombstone among `values`, as a bad record of kind `tombstone`."""
    if not values.null_count:
        return {}
    return {row: (_REASON, "tombstone") for row in pc.indices_nonzero(pc.is_null(values)).to_pylist()}
