"""The row a task returns for each range it processed, as the driver reads it.

Apart from `partition_task` so that the driver and the planning process name the statuses and the
row's schema without importing the task code (pyarrow, the decoders, the targets).
"""

from __future__ import annotations

STATUS_OK = "ok"
STATUS_RETRYABLE = "retryable"  # replay from the committed offsets
STATUS_FATAL = "fatal"  # stop the service: retrying cannot fix it
# Why a range stopped early. Upload and read failures are outages: retried while the service stays
# up. A processing failure survived the record-by-record pass, so the driver counts repeats.
# A dead-letter topic that does not acknowledge is an outage too, unless it refuses for a reason no
# replay changes (not authorised, no such topic): that is fatal (see `sink_service.task.dead_letters`).
ERROR_UPLOAD = "upload"
ERROR_READ = "read"
ERROR_DEAD_LETTER = "dead_letter"
ERROR_PROCESSING = "processing"

# (column, Spark SQL type): one row per range.
RESULT_COLUMNS = (
    ("topic", "STRING"),
    ("partition", "INT"),
    ("range_start", "BIGINT"),
    ("range_end", "BIGINT"),
    ("committable", "BIGINT"),
    ("status", "STRING"),
    ("error", "STRING"),
    ("failure_class", "STRING"),  # "", "retryable" or "fatal": upload failures only
    ("error_kind", "STRING"),  # "", ERROR_UPLOAD, ERROR_READ, ERROR_DEAD_LETTER or ERROR_PROCESSING
    ("records_read", "BIGINT"),
    ("records_written", "BIGINT"),
    ("records_uploaded", "BIGINT"),
    ("records_filtered", "BIGINT"),  # left out by SINK_TRANSFORM_SQL's WHERE: processed, not lost
    ("bad_records", "BIGINT"),
    ("bad_reasons", "STRING"),  # JSON {kind: count}
    ("bad_samples", "STRING"),  # JSON list of BadRecord descriptions
    ("dead_letters", "STRING"),  # JSON {kind: count}: acknowledged by the dead-letter topic
    ("retries", "STRING"),  # JSON {reason: count}
    ("files", "STRING"),  # JSON list of uploaded file descriptions
    # The types this range's files added to the topic's known ones (its floor joined with what it wrote,
    # encoded), or "" when they added none: the driver's planner hints learn them.
    ("written_schema", "STRING"),
)
RESULT_SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in RESULT_COLUMNS)
