"""Records that cannot become rows, named by topic, partition and offset, with a stable kind.

Every stage reports what it rejects as `{row: (reason, kind)}` (`Failures`) against the rows it
was given; `bad_records` names them by the raw records, so the stages stay free of Kafka
positions, and `kept` filters them out: a healthy batch is never copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

BAD_RECORD_KINDS = (
    "tombstone", "empty_value", "invalid_json", "invalid_key", "schema_mismatch", "reserved_field", "field_collision",
    "missing_key", "unwritable", "unknown_schema_id", "invalid_avro", "invalid_protobuf", "invalid_csv",
    "transform_failed", "invalid_header", "table_type",
)
Failures = dict[int, tuple[str, str]]  # row -> (reason, kind)


@dataclass(frozen=True)
class BadRecord:
    topic: str
    partition: int
    offset: int
    reason: str
    kind: str = "invalid_json"  # stable label for metrics: see BAD_RECORD_KINDS

    def describe(self) -> str:
        return f"topic={self.topic} partition={self.partition} offset={self.offset}: {self.reason}"


def bad_records(raw: pa.RecordBatch, failures: Failures) -> list[BadRecord]:
    """A `BadRecord` per failing row of `raw` (a batch of `RAW_SCHEMA`), in row order."""
    topic, partition, offsets = raw.column("topic"), raw.column("partition"), raw.column("offset")
    return [BadRecord(topic[row].as_py(), partition[row].as_py(), offsets[row].as_py(), reason, kind)
            for row, (reason, kind) in sorted(failures.items())]


def kept(rows: int, failures: Failures) -> pa.Array:
    """The filter mask that keeps every row but the failing ones."""
    mask = np.ones(rows, dtype=bool)
    mask[list(failures)] = False
    return pa.array(mask)

