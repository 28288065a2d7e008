"""What a Delta Lake target is told, without importing deltalake (~130 MB installed, ~60 ms to import
after pyarrow): the settings travel to every executor, and services with another target never load it."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from uploader.masking import settings_repr
from uploader.retry import RetryPolicy

TABLE_URI_SETTING = "SINK_DELTA_TABLE_URI"
PARTITION_BY_SETTING = "SINK_DELTA_PARTITION_BY"
HARD_DELETES_SETTING = "SINK_DELTA_HARD_DELETES"
POLICY_SETTING = "SINK_REJECTED_FILE_POLICY"
COMPACT_SETTING = "SINK_DELTA_COMPACT_EVERY_COMMITS"
VACUUM_EVERY_SETTING = "SINK_DELTA_VACUUM_EVERY_COMMITS"
VACUUM_RETENTION_SETTING = "SINK_DELTA_VACUUM_RETENTION_HOURS"
WIDEN_TO_STRING_SETTING = "SINK_DELTA_WIDEN_TO_STRING"
CHANGE_LOG_SETTING = "SINK_DELTA_CHANGE_LOG"
BUCKETS_SETTING = "SINK_DELTA_BUCKETS"
COMPACT_AT_SETTING = "SINK_DELTA_COMPACT_AT_CHANGES_RATIO"
COMPACT_MAX_INTERVAL_SETTING = "SINK_DELTA_COMPACT_MAX_INTERVAL_S"
# The change log of a table (change-log mode) is a second Delta table beside it, never inside it: a vacuum of
# the keyed table deletes files under its directory that its log does not reference.
CHANGES_SUFFIX = "__changes"
BUCKET = "_bucket"  # change-log mode: the hash bucket of a row's primary key, both tables' partition column
# Files a vacuum deletes were removed from the table at least this long ago: a reader (a query, a
# streaming reader of the table) that still holds an older snapshot keeps working for that long.
VACUUM_RETENTION_FLOOR_HOURS = 24
S3_SCHEME = "s3://"
# Each file's partition progress is stored in the commit that applies it, as a Delta application
# transaction under this id; the version is the first offset the table does not hold yet.
APP_ID_PREFIX = "kafka-parquet-sink"


@dataclass(frozen=True)
class DeltaSettings:
    """Frozen, hashable and picklable: the driver ships it to executors, which build their own DeltaTarget."""

    table_uri: str  # a directory or s3://bucket/path; `{topic}` is replaced by the file's topic
    group_id: str  # the consumer group: part of every application-transaction id
    partition_by: tuple[str, ...] = ()  # partition columns of a table this target creates
    hard_deletes: bool = False  # rows with `_deleted = true` delete the key's row instead of being stored
    endpoint_url: str | None = None  # SINK_S3_ENDPOINT_URL, for s3:// tables on an S3-compatible store
    region: str | None = None  # SINK_S3_REGION; None: boto3's default
    # SINK_TLS_CA_BUNDLE: PEM file the s3:// endpoint's certificate is verified against (delta-rs's
    # `certificate_path`, see delta_storage); None: the default roots. Unused for a directory table.
    ca_bundle: str | None = None
    request_timeout_s: float = 60.0
    # Maintenance, run by the writer whose merge commit lands on a multiple (0 disables; see delta_maintenance).
    compact_every_commits: int = 100
    vacuum_every_commits: int = 1000
    vacuum_retention_hours: int = 168
    widen_to_string: bool = False  # a number or bool column may become a string column (rewrites the table)
    # Change-log mode (uploader.delta_changes): batches append to `<table>__changes`; the keyed table, partitioned by
    # `_bucket`, takes them in per-bucket compactions once the change log holds `compact_at_ratio` of its bytes.
    change_log: bool = False
    buckets: int = 16
    compact_at_ratio: float = 0.30
    compact_max_interval_s: float = 600.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not self.table_uri.strip():
            raise ValueError(f"{TABLE_URI_SETTING} must name a directory or an s3:// location")
        if "://" in self.table_uri and not self.table_uri.startswith(S3_SCHEME):
            raise ValueError(f"{TABLE_URI_SETTING} must be a directory or an s3://bucket/path URI")
        if self.endpoint_url is not None:
            parts = urlsplit(self.endpoint_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("SINK_S3_ENDPOINT_URL must be an http(s) URL like https://minio.internal:9000")
        for name, value in ((COMPACT_SETTING, self.compact_every_commits),
                            (VACUUM_EVERY_SETTING, self.vacuum_every_commits),
                            (VACUUM_RETENTION_SETTING, self.vacuum_retention_hours)):
            if value < 0:
                raise ValueError(f"{name} must be 0 (off) or positive, not {value}")
        if not 1 <= self.buckets <= 1024:
            raise ValueError(f"{BUCKETS_SETTING} must be between 1 and 1024, not {self.buckets}")
        if not 0 < self.compact_at_ratio <= 100:
            raise ValueError(f"{COMPACT_AT_SETTING} must be above 0 and at most 100, not {self.compact_at_ratio}")
        if self.compact_max_interval_s <= 0:
            raise ValueError(f"{COMPACT_MAX_INTERVAL_SETTING} must be positive, not {self.compact_max_interval_s}")

    def uri_for(self, topic: str) -> str:
        return self.table_uri.replace("{topic}", topic)

    def changes_uri_for(self, topic: str) -> str:
        """The change log beside the table (change-log mode)."""
        return self.uri_for(topic).rstrip("/") + CHANGES_SUFFIX

    def table_partition_by(self) -> tuple[str, ...]:
        """The partition columns of a keyed table this target creates: `_bucket` last in change-log mode, so a
        compaction's merge is pinned to one bucket and rewrites only its files."""
        return (*self.partition_by, BUCKET) if self.change_log else self.partition_by

    def compaction_app_id(self, bucket: int) -> str:
        """The keyed table's application transaction for a bucket: the change-log version compacted into it."""
        return f"{APP_ID_PREFIX}/{self.group_id}/compacted-changes/{bucket}"

    def app_id(self, topic: str, partition: int) -> str:
        """One id per group and topic-partition: two groups feeding one table never mask each other."""
        return f"{APP_ID_PREFIX}/{self.group_id}/{topic}/{partition}"

    def on_s3(self) -> bool:
        return self.table_uri.startswith(S3_SCHEME)

    def __repr__(self) -> str:
        return settings_repr(self)
