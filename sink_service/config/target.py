"""Upload target settings (EMS, S3, dir, parking, TLS, upload budget) and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from sink_service.config.declare import setting
from uploader.delta_settings import VACUUM_RETENTION_FLOOR_HOURS

S3_URL_SCHEME = "s3://"


@dataclass(frozen=True)
class TargetSettings:
    """Upload target settings: part of `SinkConfig`."""

    target: str = setting(
        "SINK_TARGET", "Where files go: `ems` (Celonis EMS continuous push), `s3` (Amazon S3 or an "
        "S3-compatible store), `dir` (a local or mounted directory) or `delta` (files merged into a Delta "
        "Lake table, latest row per key, exactly once).", "ems",
        choices=("ems", "s3", "dir", "delta"), group="Target")
    ems_endpoint: str | None = setting(
        "SINK_EMS_ENDPOINT", "EMS continuous-push URL, `https://<team>.<realm>.celonis.cloud/"
        "continuous-batch-processing/api/v1/<pool-id>/items`. Plain http only to loopback.",
        group="Target")
    ems_authorization: str | None = setting(
        "SINK_EMS_AUTHORIZATION", "Authorization header sent verbatim: `AppKey <key>` or "
        "`Bearer <token>`.", secret=True, group="Target")
    ems_target_table: str | None = setting(
        "SINK_EMS_TARGET_TABLE", "EMS `targetName`. `{topic}` is replaced by the topic name. "
        "Used only with `SINK_TARGET=ems`.", group="Target")
    ems_connection_id: str | None = setting(
        "SINK_EMS_CONNECTION_ID", "EMS `connectionId` (optional).", group="Target")
    ems_client_id: str = setting(
        "SINK_EMS_CLIENT_ID", "EMS `clientId`.", "kafka-parquet-sink", group="Target")
    ems_fallback_varchar_length: int | None = setting(
        "SINK_EMS_FALLBACK_VARCHAR_LENGTH", "EMS `fallbackVarcharLength` (optional).", minimum=1,
        group="Target")
    ems_proxy_url: str | None = setting(
        "SINK_EMS_PROXY_URL", "Proxy for EMS traffic: `http://host:port`, `https://...` or "
        "`socks5://...`. Overrides HTTPS_PROXY.", group="Target")
    ems_proxy_username: str | None = setting(
        "SINK_EMS_PROXY_USERNAME", "Proxy user name (optional).", group="Target")
    ems_proxy_password: str | None = setting(
        "SINK_EMS_PROXY_PASSWORD", "Proxy password (optional).", secret=True, group="Target")
    s3_bucket: str | None = setting(
        "SINK_S3_BUCKET", "Bucket files are written to; required when `SINK_TARGET=s3`. Credentials "
        "come only from boto3's standard chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, "
        "`AWS_PROFILE`, web identity, the instance or pod role), never from SINK_* settings.",
        group="Target")
    s3_prefix: str = setting(
        "SINK_S3_PREFIX", "Key prefix. Objects are named `<prefix>/<topic>/<partition>/"
        "<first offset, 20 digits>-<last offset, 20 digits>.parquet`, so a replayed range overwrites "
        "the same object.", "", group="Target")
    s3_endpoint_url: str | None = setting(
        "SINK_S3_ENDPOINT_URL", "Endpoint of an S3-compatible store that is not AWS (MinIO, Ceph, "
        "...), e.g. `https://minio.internal:9000`; path-style addressing is used with it. Empty: AWS. "
        "Plain http only to loopback, unless `SINK_S3_ALLOW_HTTP=true`.", group="Target")
    s3_allow_http: bool = setting(
        "SINK_S3_ALLOW_HTTP", "Accept a plain `http://` `SINK_S3_ENDPOINT_URL` to a host that is not "
        "loopback. Dangerous: every file then crosses the network unencrypted, readable and alterable by "
        "anyone on the path, and a captured signed request can be replayed for minutes. Only for a "
        "store on a trusted, isolated network.", False, group="Target")
    s3_region: str | None = setting(
        "SINK_S3_REGION", "Region of the bucket. Empty: boto3's default (`AWS_REGION`, "
        "`AWS_DEFAULT_REGION` or the profile).", group="Target")
    s3_multipart_part_size: int = setting(
        "SINK_S3_MULTIPART_PART_SIZE", "Files at least this large (bytes) are uploaded in parts of "
        "this size, several at a time; smaller files in one request. S3's minimum part size is 5 MiB.",
        16 * 1024 * 1024, minimum=5 * 1024 * 1024, group="Target")
    dir_path: str | None = setting(
        "SINK_DIR_PATH", "Directory files are written to; required when `SINK_TARGET=dir`. Files are "
        "named like S3 objects, `<path>/<topic>/<partition>/<first>-<last>.parquet`, and written "
        "atomically (temporary `.<name>.tmp-<id>` file, fsync, rename). On a cluster every executor "
        "must see the same directory.", group="Target")
    delta_table_uri: str | None = setting(
        "SINK_DELTA_TABLE_URI", "Delta table the files are merged into; required when `SINK_TARGET=delta`. A "
        "directory or `s3://<bucket>/<path>` (reached with `SINK_S3_ENDPOINT_URL`, `SINK_S3_REGION` and boto3's "
        "credentials, resolved by boto3 and handed to delta-rs). `{topic}` is replaced by the topic name. Created "
        "on the first write from that file's schema. Rows are merged on `SINK_PRIMARY_KEYS` by "
        "`SINK_ORDER_FIELD` (EMS's rule), and each commit stores its partitions' offsets, so a replay is never "
        "applied twice.", group="Target")
    delta_partition_by: tuple[str, ...] = setting(
        "SINK_DELTA_PARTITION_BY", "Comma-separated partition columns of a Delta table the service creates "
        "(none by default). Ignored for a table that exists.", (), group="Target")
    delta_hard_deletes: bool = setting(
        "SINK_DELTA_HARD_DELETES", "With `SINK_TARGET=delta` and `SINK_TOMBSTONES=soft-delete`: a tombstone "
        "newer than the key's row deletes that row from the table instead of storing it with `_deleted=true`. "
        "Needs `SINK_ORDER_FIELD=_offset`.",
        False, group="Target")
    delta_merge_max_bytes: int = setting(
        "SINK_DELTA_MERGE_MAX_BYTES", "The driver merges a micro-batch's staged files into the Delta table in "
        "commits of at most this many bytes of rows, decoded (Arrow; the task's writer counts them): a batch "
        "with more is applied in several commits, each partition's files in offset order, and a file with "
        "more in pieces of whole row groups. It bounds the driver's merge memory: about 140 MB plus 3x this "
        "(`bench/delta_merge_memory.py`). One row group (up to 32 MiB) is never cut.", 32 * 1024 * 1024,
        minimum=1024 * 1024, group="Target")
    delta_compact_every_commits: int = setting(
        "SINK_DELTA_COMPACT_EVERY_COMMITS", "Table maintenance: the merge that commits a Delta version that "
        "is a multiple of this compacts the table's small files (`optimize.compact`, application transactions "
        "kept) and removes log entries older than `delta.logRetentionDuration`, after its merge; a maintenance "
        "that conflicts with a concurrent merge is logged and left to the next multiple, and never fails the "
        "merge. delta-rs itself writes a log checkpoint every `delta.checkpointInterval` (100) commits. 0 "
        "turns compaction off.", 100, minimum=0, group="Target")
    delta_vacuum_every_commits: int = setting(
        "SINK_DELTA_VACUUM_EVERY_COMMITS", "Table maintenance: the merge that commits a multiple of this "
        "version also vacuums the table (deletes files removed from it, and files no commit references, more "
        "than `SINK_DELTA_VACUUM_RETENTION_HOURS` ago). 0 turns vacuum off.", 1000, minimum=0, group="Target")
    delta_vacuum_retention_hours: int = setting(
        "SINK_DELTA_VACUUM_RETENTION_HOURS", "How long a file removed from the Delta table (by a merge or a "
        "compaction) is kept before vacuum deletes it: a reader holding an older snapshot keeps working that "
        "long. At least 24; the table's own `delta.deletedFileRetentionDuration` wins when longer. 0 turns "
        "vacuum off.", 168, minimum=0, group="Target")
    delta_widen_to_string: bool = setting(
        "SINK_DELTA_WIDEN_TO_STRING", "A file whose column is text where the Delta table's column is a number or "
        "boolean (the decode lattice widened it) rewrites the table once with that column as text (old values "
        "as the decoder writes them: `12`, `1.5`, `true`). Off: such a file is refused as bad content "
        "(`SINK_REJECTED_FILE_POLICY`), because one stray value would make the column text for good. Numeric "
        "widenings (a double for a long column) always rewrite the table; narrower files are cast up.",
        False, group="Target")
    delta_change_log: bool = setting(
        "SINK_DELTA_CHANGE_LOG", "Change-log mode, for tables of millions of keys: each micro-batch APPENDS its "
        "latest row per key to a second Delta table beside the keyed one, `<SINK_DELTA_TABLE_URI>__changes`, "
        "partitioned by `_bucket` (a hash of the primary key) and stamped `_change_version`; the keyed table "
        "(partitioned by `_bucket` when the service creates it) takes those changes in per-bucket compactions "
        "run by the driver in the background. The bytes written then follow the updates, not the table "
        "(a merge rewrites every file holding one of its keys). A reader sees every record at once through the "
        "view of both tables (README, *Delta Lake target*); the keyed table alone is as fresh as its last "
        "compaction. Off: each micro-batch merges into the keyed table itself.", False, group="Target")
    delta_buckets: int = setting(
        "SINK_DELTA_BUCKETS", "Change-log mode: hash buckets of the primary key, the `_bucket` partitions of "
        "both tables. A compaction merges one bucket at a time, so its memory and its rewrite are a bucket's; "
        "about one bucket per million keys. Fixed for a table's life: a new value needs a new table.", 16,
        minimum=1, group="Target")
    delta_compact_at_changes_percent: int = setting(
        "SINK_DELTA_COMPACT_AT_CHANGES_PERCENT", "Change-log mode: compact once the change log's files hold this "
        "share of the keyed table's bytes. Each compaction rewrites the keyed table, so bytes written per hour "
        "are about the updates' bytes x (1 + 100 / this): 4.3x at 30 (measured: 4.24x at 1M keys, 4.06x at 10M). Lower "
        "keeps the keyed table fresher and writes more.", 30, minimum=1, group="Target")
    delta_compact_max_interval_s: int = setting(
        "SINK_DELTA_COMPACT_MAX_INTERVAL_S", "Change-log mode: compact at least this often while there are "
        "changes, however small the change log: the keyed table alone is never older than this plus one "
        "compaction.", 600, minimum=1, group="Target")
    rejected_file_policy: str = setting(
        "SINK_REJECTED_FILE_POLICY", "A file the endpoint rejects as bad content (EMS: HTTP 400 or 413; S3: "
        "`EntityTooLarge`; Delta: a column type the table cannot take): `fail` stops the service with exit 3; "
        "`park` writes it and the endpoint's answer to "
        "`SINK_PARKED_PATH`, commits its offsets, counts it in `sink_parked_files_total`, logs an "
        "ERROR and continues. Every other rejection is a configuration problem and stops the service either "
        "way: EMS's 401/403/404, and S3's credential, region and clock errors even when S3 sends them as "
        "400 (`ExpiredToken`, `InvalidToken`, `AuthorizationHeaderMalformed`, `InvalidArgument`).",
        "fail", choices=("fail", "park"), group="Target")
    parked_path: str | None = setting(
        "SINK_PARKED_PATH", "Where rejected files are parked when `SINK_REJECTED_FILE_POLICY=park` (required "
        "then): a directory, or `s3://<bucket>/<prefix>` reached with `SINK_S3_ENDPOINT_URL`, `SINK_S3_REGION`, "
        "`SINK_TLS_CA_BUNDLE` and boto3's credentials, whatever `SINK_TARGET` is. `<path>/<topic>/<partition>/"
        "<first>-<last>.parquet` plus `<same>.response.json` with the endpoint's status, body and the file's "
        "metadata, both written atomically. Re-push one with `python -m uploader push <file or s3:// URL>`. "
        "On a cluster every executor must see the same directory.", group="Target")
    tls_ca_bundle: str | None = setting(
        "SINK_TLS_CA_BUNDLE", "PEM file of the CA certificates that HTTPS connections (EMS, its "
        "proxy, S3, Delta tables on S3, the schema registry) are verified against, for endpoints with a private "
        "or self-signed CA. A certificate that does not verify is fatal (exit 3), never retried. It replaces "
        "the default CA store, so include every CA needed; only for Delta tables on S3 is it added to the "
        "default CAs instead (delta-rs's `certificate_path`, which cannot drop them). Checked at startup; on a "
        "cluster every executor must see the same file. When set, it wins over `REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE` "
        "and `AWS_CA_BUNDLE` for every client. Empty: the system's CAs (and those variables). Kafka has "
        "its own: `SINK_KAFKA_SSL_CA_LOCATION`.", group="Target")
    upload_timeout_ms: int = setting(
        "SINK_UPLOAD_TIMEOUT_MS", "Timeout of one upload request.", 60_000, minimum=100,
        group="Target")
    upload_retry_budget_ms: int = setting(
        "SINK_UPLOAD_RETRY_BUDGET_MS", "How long one file's upload is retried (exponential backoff "
        "with jitter, honouring Retry-After) before its micro-batch fails and is replayed from the "
        "committed offsets.", 60_000, minimum=0, group="Target")


def check_delta(c: object) -> list[str]:
    """`SINK_TARGET=delta`'s own settings (a `SinkConfig`); the S3 endpoint is checked as for the s3 target."""
    uri: str = getattr(c, "delta_table_uri", None) or ""
    problems = []
    if not uri.strip():
        problems.append("SINK_DELTA_TABLE_URI is required when SINK_TARGET=delta: a directory or "
                        "`s3://<bucket>/<path>` (`{topic}` gives one table per topic).")
    elif "://" in uri and not uri.startswith(S3_URL_SCHEME):
        problems.append(f"SINK_DELTA_TABLE_URI must be a directory or an `s3://<bucket>/<path>` URI, not "
                        f"{uri.split('://')[0]}://.")
    elif uri.startswith(S3_URL_SCHEME) and not uri[len(S3_URL_SCHEME):].partition("/")[0]:
        problems.append(f"SINK_DELTA_TABLE_URI={uri} names no bucket; use `s3://<bucket>/<path>`.")
    retention = getattr(c, "delta_vacuum_retention_hours", 168)
    if 0 < retention < VACUUM_RETENTION_FLOOR_HOURS:
        problems.append(f"SINK_DELTA_VACUUM_RETENTION_HOURS={retention} is below the safe floor of "
                        f"{VACUUM_RETENTION_FLOOR_HOURS} hours: vacuum would delete files that a reader holding an "
                        "older snapshot of the table still reads. Use at least "
                        f"{VACUUM_RETENTION_FLOOR_HOURS} (default 168, Delta's 7 days), or 0 to turn vacuum off.")
    if getattr(c, "delta_hard_deletes", False) and getattr(c, "tombstones", "") != "soft-delete":
        problems.append("SINK_DELTA_HARD_DELETES=true needs SINK_TOMBSTONES=soft-delete: deletes reach the "
                        "table as rows with `_deleted=true`.")
    if getattr(c, "delta_hard_deletes", False) and getattr(c, "order_field", "_offset") != "_offset":
        problems.append(f"SINK_DELTA_HARD_DELETES=true needs SINK_ORDER_FIELD=_offset (the default), not "
                        f"{c.order_field}: a deleted key leaves no row to compare a late, older record with, so "
                        "under another order field that record would bring the key back or not depending on how "
                        "the records were batched. Keep soft deletes (rows with `_deleted=true`; read through a view "
                        "that filters them), or order by `_offset`.")
    return problems
