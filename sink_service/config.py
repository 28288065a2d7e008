"""Configuration declared as data.

Every setting is declared once, as a field of `SinkConfig` with its environment name, default,
doc and secrecy. That one declaration drives validation (all problems reported at once), the
masked startup dump and the README's configuration reference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import ipaddress
import re
import ssl
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sink_service.column_names import DEFAULT_METADATA_COLUMNS
from uploader.masking import mask_userinfo

if TYPE_CHECKING:
    import pyarrow as pa

    from sink_service.transform import Transform

MASK = "*****"
S3_URL_SCHEME = "s3://"
STRUCTURED_KEY_FORMATS = ("json", "avro", "protobuf")  # keys whose fields become columns (decode/keys.py)
REGISTRY_FORMATS = ("avro", "protobuf")  # formats whose schemas come from SINK_SCHEMA_REGISTRY_URL
KAFKA_PASSTHROUGH_PREFIX = "SINK_KAFKA_"
# SINK_* names that are not settings: the test harness's broker choice (devkit/brokers.py). A
# developer's shell may export them while it also runs the service or `python -m uploader`.
NON_SETTING_NAMES = frozenset({"SINK_TEST_BROKER", "SINK_TEST_BOOTSTRAP"})
_SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN", "CREDENTIAL")
# librdkafka settings the service sets itself, and why a SINK_KAFKA_* override is refused at startup
# (e.g. cooperative-sticky made the group member's eager assign raise: no commit was answered again).
RESERVED_KAFKA_OPTIONS = {
    "bootstrap.servers": "it comes from SINK_KAFKA_BOOTSTRAP_SERVERS",
    "group.id": "it comes from SINK_GROUP_ID",
    "enable.auto.commit": "offsets are committed only after their files were uploaded",
    "enable.auto.offset.store": "offsets are committed only after their files were uploaded",
    "partition.assignment.strategy": "the group member assigns eagerly (a rebalance revokes everything and "
                                     "the query restarts on the new assignment); cooperative assignors are "
                                     "not supported",
    "group.protocol": "the group member uses the classic protocol, whose eager rebalances and static "
                      "membership it depends on",
    "group.instance.id": "each instance derives its own from its host name and SINK_SCRATCH_DIR; one id "
                         "shared by two instances makes the broker fence them in turn",
    "isolation.level": "reads are read_committed and offset ranges end at the last stable offset",
}
_SENSITIVE_KAFKA_OPTIONS = frozenset({
    "ssl.key.pem", "ssl.certificate.pem", "ssl.keystore.password", "ssl.key.password",
    "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret", "sasl.password",
})


class ConfigError(Exception):
    """Raised at startup with every configuration problem found, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{len(problems)} configuration problem(s):\n{lines}")


def setting(
    env: str,
    doc: str,
    default: Any = None,
    *,
    secret: bool = False,
    choices: tuple[str, ...] | None = None,
    minimum: int | None = None,
    group: str = "General",
) -> Any:
    """Declare one setting as a dataclass field carrying its env name and documentation."""
    meta = {"env": env, "doc": doc, "secret": secret, "choices": choices, "minimum": minimum, "group": group}
    if isinstance(default, tuple | list):
        return field(default=tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SinkConfig:
    # --- Kafka source -------------------------------------------------------------------------
    kafka_bootstrap_servers: str = setting(
        "SINK_KAFKA_BOOTSTRAP_SERVERS", "Kafka bootstrap servers, `host:port[,host:port]`. Required.",
        group="Kafka")
    topics: tuple[str, ...] = setting(
        "SINK_TOPICS", "Comma-separated topics to consume. Set this or `SINK_TOPIC_PATTERN`.", (),
        group="Kafka")
    topic_pattern: str | None = setting(
        "SINK_TOPIC_PATTERN",
        "Regular expression matched against whole topic names; new matching topics and partitions "
        "are picked up without a restart. Set this or `SINK_TOPICS`.", group="Kafka")
    group_id: str = setting(
        "SINK_GROUP_ID", "Consumer group whose committed offsets are the service's only progress "
        "record. Lag is visible to standard Kafka tooling under this name.", "kafka-parquet-sink",
        group="Kafka")
    starting_offsets: str = setting(
        "SINK_STARTING_OFFSETS", "Where partitions without a committed offset start at the consumer "
        "group's first start, while the group has committed nothing yet. A `latest` position is "
        "committed at once, so replays and restarts keep it. Once the group has committed, every "
        "partition without a commit (a topic or partition created or matched later, found while "
        "running or while the service was down) starts at its earliest offset, whichever process "
        "finds it.",
        "earliest", choices=("earliest", "latest"), group="Kafka")
    retention_gap_policy: str = setting(
        "SINK_RETENTION_GAP_POLICY",
        "What to do when a committed offset lies outside the log: fallen out of retention, or beyond "
        "the log end (truncation, a topic deleted and recreated). `fail` stops with exit 3 and commits "
        "nothing; `skip` restarts the partition at its earliest available offset and logs `RECORDS LOST`.",
        "fail", choices=("fail", "skip"), group="Kafka")
    topic_refresh_interval_ms: int = setting(
        "SINK_TOPIC_REFRESH_INTERVAL_MS", "How often topic metadata is re-read to discover new "
        "topics (pattern) and partitions.", 30_000, minimum=1000, group="Kafka")
    read_batch_max_bytes: int = setting(
        "SINK_READ_BATCH_MAX_BYTES", "Most bytes of keys and values a task reads from Kafka before it "
        "decodes and writes them; with the 20,000-record cap this bounds a task's memory whatever "
        "the record size.", 32 * 1024 * 1024, minimum=1024, group="Kafka")
    # SINK_KAFKA_<NAME> pass-through is documented separately (see `kafka_passthrough`).

    # --- Flush thresholds ---------------------------------------------------------------------
    flush_records: int = setting(
        "SINK_FLUSH_RECORDS", "A partition's pending data is written once it has this many records; "
        "also the most records one file holds.", 100_000, minimum=1, group="Flush")
    flush_bytes: int = setting(
        "SINK_FLUSH_BYTES", "A partition's pending data is written once its estimated Parquet size "
        "reaches this; files are capped at this size plus at most one row group.",
        64 * 1024 * 1024, minimum=1024, group="Flush")
    flush_interval_ms: int = setting(
        "SINK_FLUSH_INTERVAL_MS", "A partition's pending data is written once its oldest pending "
        "record has waited this long (wall clock, from the last look before it appeared, so a slow "
        "micro-batch does not add to it), even while other partitions are busy. A micro-batch that "
        "runs for this reason also takes every partition whose data has waited half as long, so "
        "partitions flushed by time fall into step instead of each costing a micro-batch.",
        60_000, minimum=100, group="Flush")
    poll_interval_ms: int = setting(
        "SINK_POLL_INTERVAL_MS", "Micro-batch trigger interval: how often thresholds are checked.",
        1000, minimum=50, group="Flush")
    max_files_per_batch: int = setting(
        "SINK_MAX_FILES_PER_BATCH", "Most offset ranges (files) admitted into one micro-batch; "
        "bounds batch duration, time to the first commit and how much is replayed after a crash.", 8, minimum=1,
        group="Flush")

    # --- Records ------------------------------------------------------------------------------
    primary_keys: tuple[str, ...] = setting(
        "SINK_PRIMARY_KEYS", "Comma-separated value fields forming the primary key. A record "
        "missing one, or with a null, is a bad record. `_key` (the Kafka key) may be used. Unset with "
        "`SINK_KEY_FORMAT=json`: the key's fields (with their prefix), which every key must then have.", (),
        group="Records")
    order_field: str = setting(
        "SINK_ORDER_FIELD", "Column sent as `duplicateRemovalOrderColumn`; the endpoint keeps the "
        "row with the highest value per key. Default: `_offset`, the Kafka offset.", "_offset",
        group="Records")
    key_format: str = setting(
        "SINK_KEY_FORMAT", "How the Kafka key is read: `string` (the `_key` column holds its text), `raw` "
        "(`_key` holds its bytes) or `json` (a JSON object whose fields become columns, `_key` holding its "
        "text; a key that is not an object is a bad record). A key field and a value field with the same "
        "name share one column, and the value wins: the key's is used only where the value lacks the field. "
        "`avro`, `protobuf`: framed for the schema registry like such values (`SINK_VALUE_FORMAT`); its fields "
        "become columns as a JSON key's do, and `_key` holds its bytes.",
        "string", choices=("string", "json", "raw", "avro", "protobuf"), group="Records")
    key_fields_prefix: str = setting(
        "SINK_KEY_FIELDS_PREFIX", "Put before the name of each JSON key field, e.g. `key_`, so key and "
        "value fields cannot share a name. Only with a key whose fields become columns (`SINK_KEY_FORMAT` "
        "`json`, `avro` or `protobuf`).", "", group="Records")
    tombstones: str = setting(
        "SINK_TOMBSTONES", "Records with a null value (deletes): `skip` leaves them out, counted and logged "
        "as bad records of kind `tombstone`, never stopping the service; `fail` makes them bad records under "
        "`SINK_ERROR_POLICY`; `soft-delete` writes a row with the key fields, the metadata columns and "
        "`_deleted=true`, and `_deleted=false` on every other row (needs primary keys a tombstone carries: "
        "JSON key fields or `_key`, and a metadata order field).", "skip",
        choices=("fail", "skip", "soft-delete"), group="Records")
    metadata_columns: tuple[str, ...] = setting(
        "SINK_METADATA_COLUMNS", "Comma-separated Kafka metadata columns written: any of `_key`, `_topic`, "
        "`_partition`, `_offset`, `_timestamp` and `_headers` (the record's headers as a JSON object), or "
        "`none`. The order field and primary keys among them are written in any case.",
        DEFAULT_METADATA_COLUMNS, group="Records")
    value_schema: str | None = setting(
        "SINK_VALUE_SCHEMA", "Optional Spark DDL for the JSON value, e.g. `id STRING, amount "
        "DOUBLE`. Fields not declared are not written. When absent the schema is inferred and no "
        "field is dropped.", group="Records")
    value_format: str = setting(
        "SINK_VALUE_FORMAT", "How the Kafka value is read: `json` (an object per value); `avro` or `protobuf` "
        "in the schema registry's wire format (magic byte 0, 4-byte schema id), decoded with the writer's schema "
        "fetched from `SINK_SCHEMA_REGISTRY_URL`; `csv` (one row per value, see `SINK_CSV_*`); or `raw` (the "
        "value's bytes in one binary column `value`). See \"Value formats\".", "json",
        choices=("json", "avro", "protobuf", "csv", "raw"), group="Records")
    csv_columns: str | None = setting(
        "SINK_CSV_COLUMNS", "With `SINK_VALUE_FORMAT=csv`: the columns of each row, in order, as Spark DDL, e.g. "
        "`id BIGINT, name STRING, amount DECIMAL(10,2)` (flat types only). Required unless `SINK_CSV_HEADER=true`; "
        "with a header it types the columns it names.", group="Records")
    csv_header: bool = setting(
        "SINK_CSV_HEADER", "With `SINK_VALUE_FORMAT=csv`: each value is a header line naming its columns, then one "
        "row. Columns not typed by `SINK_CSV_COLUMNS` are strings.", False, group="Records")
    csv_delimiter: str | None = setting(
        "SINK_CSV_DELIMITER", "With `SINK_VALUE_FORMAT=csv`: the field delimiter, one character (default `,`; "
        "`\\t` for a tab).",
        group="Records")
    csv_quote: str | None = setting(
        "SINK_CSV_QUOTE", "With `SINK_VALUE_FORMAT=csv`: the quote character (default `\"`); a quoted field may "
        "hold the delimiter, newlines and the quote doubled.", group="Records")
    schema_registry_url: str | None = setting(
        "SINK_SCHEMA_REGISTRY_URL", "Confluent-compatible schema registry, e.g. `https://registry:8081`; "
        "required with the `avro` and `protobuf` value or key formats. Schemas are fetched by id and cached; a "
        "registry that does not answer is an outage (retried, readiness false), never a bad record.", group="Records")
    schema_registry_basic_auth: str | None = setting(
        "SINK_SCHEMA_REGISTRY_BASIC_AUTH", "`user:password` for the schema registry's HTTP basic auth.",
        secret=True, group="Records")
    error_policy: str = setting(
        "SINK_ERROR_POLICY", "Records that cannot be decoded or lack a primary key: `fail` stops "
        "with an error naming topic, partition and offset; `skip` logs and counts each one; `dlq` also "
        "produces each one, unchanged, to `SINK_DLQ_TOPIC` and commits its offset only once the topic "
        "has acknowledged it (see Operations: dead letters).",
        "fail", choices=("fail", "skip", "dlq"), group="Records")
    dlq_topic: str | None = setting(
        "SINK_DLQ_TOPIC", "Dead-letter topic, on the source cluster, for `SINK_ERROR_POLICY=dlq` (required "
        "then): each bad record's original key, value and headers, plus `sink.error.kind`, "
        "`sink.error.message`, `sink.source.topic`, `sink.source.partition`, `sink.source.offset` and "
        "`sink.source.timestamp` headers, produced with `acks=all`. A broker that cannot be reached holds "
        "the partition at the bad record (not ready) until it can; a topic that can never take it (not "
        "authorised, an invalid name, missing and not created, compacted with a keyless record) stops the "
        "service with exit 3. A dead letter too large for the topic is cut to fit and marked "
        "`sink.truncated=true`. Replay with "
        "`python -m sink_service.dead_letters replay`.", group="Records")
    max_identical_failures: int = setting(
        "SINK_MAX_IDENTICAL_FAILURES", "A partition whose replay fails this many times in a row at the "
        "same offset with the same error (not an upload or broker outage, which are retried while the "
        "service stays up) stops the service with exit 3, naming topic, partition, offset and cause.",
        5, minimum=1, group="Records")
    parquet_compression: str = setting(
        "SINK_PARQUET_COMPRESSION", "Parquet compression codec.", "snappy",
        choices=("snappy", "zstd", "gzip", "lz4", "brotli", "none"), group="Records")

    # --- Row shape: flattening, compaction, obfuscation -----------------------------------------
    flatten: bool | None = setting(
        "SINK_FLATTEN", "Flat rows, as relational tables (EMS) need: nested objects become `parent_child` "
        "columns, arrays compact JSON text, and every character of a name outside `[A-Za-z0-9_]` "
        "becomes `_`. Primary keys and the order field then name flattened columns (`customer_id`). "
        "Fields that become one name share the column; a record holding values in two of them is a "
        "bad record. Default: `true` with `SINK_TARGET=ems`, else `false` (S3 and dir files keep "
        "nested structs).", group="Row shape")
    flatten_discard_collections: bool = setting(
        "SINK_FLATTEN_DISCARD_COLLECTIONS", "With flattening, arrays are dropped instead of written "
        "as JSON text.", False, group="Row shape")
    lowercase_fields: bool = setting(
        "SINK_LOWERCASE_FIELDS", "With flattening, column names are lowercased (as the EMS connector "
        "can); `Id` and `id` then share one column.", False, group="Row shape")
    decimals_as_double: bool = setting(
        "SINK_DECIMALS_AS_DOUBLE", "With flattening, decimal columns (integers beyond 64 bits, "
        "declared DECIMALs) are written as doubles, as EMS tables expect: exact to about 15 "
        "significant digits.", False, group="Row shape")
    compact_files: bool = setting(
        "SINK_COMPACT_FILES", "With primary keys, a file holds only the latest row of each key "
        "(highest order value; of equal ones, the later offset), the row the endpoint would keep: "
        "the same end state with fewer rows uploaded. A file still covers all its offsets.",
        True, group="Row shape")
    obfuscate_fields: tuple[str, ...] = setting(
        "SINK_OBFUSCATE_FIELDS", "Comma-separated dotted paths of fields to obfuscate, e.g. "
        "`customer.email,items.card`, applied before flattening; a path through an array applies to "
        "each element, a path naming an object or array replaces it whole. `_key` may be named.", (),
        group="Row shape")
    obfuscation_method: str = setting(
        "SINK_OBFUSCATION_METHOD", "`fix`: each value becomes `*****`. `sha1`, `sha512`: the hex "
        "digest of the salt followed by the value's text (UTF-8; numbers as their digits, objects as "
        "compact JSON), salted for every value. A hashed primary key still matches its rows; a "
        "`fix`-masked primary key and an obfuscated order field are rejected.", "fix",
        choices=("fix", "sha1", "sha512"), group="Row shape")
    obfuscation_salt: str | None = setting(
        "SINK_OBFUSCATION_SALT", "Salt put before every value hashed by `sha1`/`sha512` (required "
        "with them). Keep it stable: a new salt changes every hash, and so every hashed key.",
        secret=True, group="Row shape")

    # --- Transform ----------------------------------------------------------------------------
    transform_sql: str | None = setting(
        "SINK_TRANSFORM_SQL", "A Spark SQL `SELECT … FROM records` run over the decoded rows (after "
        "flattening and obfuscation), e.g. `SELECT id, CAST(amount AS DECIMAL(10,2)) AS amount, upper(status) "
        "AS status FROM records WHERE status <> 'test'`: rename, filter, compute or cast columns. Row-wise only "
        "(no joins, aggregates, windows, subqueries, ORDER BY or LIMIT). `SINK_PRIMARY_KEYS` and "
        "`SINK_ORDER_FIELD` name its output columns; `_offset` is carried through. A record it fails on (e.g. "
        "a CAST that does not convert) is a bad record (`transform_failed`); records its WHERE leaves out are "
        "committed, not written. See \"Transform\".",
        group="Transform")

    # --- Upload target ------------------------------------------------------------------------
    target: str = setting(
        "SINK_TARGET", "Where files go: `ems` (Celonis EMS continuous push), `s3` (Amazon S3 or an "
        "S3-compatible store) or `dir` (a local or mounted directory).", "ems",
        choices=("ems", "s3", "dir"), group="Target")
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
    rejected_file_policy: str = setting(
        "SINK_REJECTED_FILE_POLICY", "A file the endpoint rejects as bad content (EMS: HTTP 400 or 413; S3: "
        "`EntityTooLarge`): `fail` stops the service with exit 3; `park` writes it and the endpoint's answer to "
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
        "proxy, S3, the schema registry) are verified against, for endpoints with a private or self-signed CA. "
        "A certificate that does not verify is fatal (exit 3), never retried. It replaces "
        "the default CA store, so include every CA needed. Checked at startup; on a cluster every "
        "executor must see the same file. Empty: the system's CAs (and `REQUESTS_CA_BUNDLE`/"
        "`AWS_CA_BUNDLE`). Kafka has its own: `SINK_KAFKA_SSL_CA_LOCATION`.", group="Target")
    upload_timeout_ms: int = setting(
        "SINK_UPLOAD_TIMEOUT_MS", "Timeout of one upload request.", 60_000, minimum=100,
        group="Target")
    upload_retry_budget_ms: int = setting(
        "SINK_UPLOAD_RETRY_BUDGET_MS", "How long one file's upload is retried (exponential backoff "
        "with jitter, honouring Retry-After) before its micro-batch fails and is replayed from the "
        "committed offsets.", 60_000, minimum=0, group="Target")

    # --- Runtime ------------------------------------------------------------------------------
    spark_master: str = setting(
        "SINK_SPARK_MASTER", "Spark master URL: `local[*]` or `spark://host:7077`.", "local[*]",
        group="Runtime")
    spark_auth_secret: str | None = setting(
        "SINK_SPARK_AUTH_SECRET", "Shared secret for Spark's RPC authentication and AES encryption "
        "(`spark.authenticate`, `spark.network.crypto.enabled`), which the service turns on whenever "
        "`SINK_SPARK_MASTER` is not `local`: task specs carry the upload credentials to executors. "
        "Required with a standalone master (`spark://`), whose master and workers must run with the "
        "same secret (`SPARK_DAEMON_JAVA_OPTS=-Dspark.authenticate=true` and the secret in their "
        "`_SPARK_AUTH_SECRET` environment variable, never on a command line); YARN and Kubernetes "
        "generate one when it is unset. The service hands it to its JVM over py4j, so no process "
        "shows it in `ps`.",
        secret=True, group="Runtime")
    http_port: int = setting(
        "SINK_HTTP_PORT", "Port of `/healthz` and `/readyz`; 0 disables the HTTP server.", 8080,
        minimum=0, group="Runtime")
    http_host: str = setting(
        "SINK_HTTP_HOST", "Address the HTTP server binds to. `0.0.0.0` (every interface) lets "
        "Kubernetes probes and a Prometheus scrape reach it; `127.0.0.1` keeps it on the host, or "
        "name one interface's address (`::` for every IPv6 interface). Executors post their live "
        "upload signals to it, authenticated by a per-start token in a header; a request without "
        "the token, or with a missing, invalid or over-64 KiB length, is refused before its body "
        "is read. On a cluster, bind an address the executors reach (with `127.0.0.1` their "
        "signals are lost and retries are counted when tasks end).",
        "0.0.0.0", group="Runtime")
    log_level: str = setting(
        "SINK_LOG_LEVEL", "Service log level.", "INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"), group="Runtime")
    log_format: str = setting(
        "SINK_LOG_FORMAT", "`text`, or `json` for one JSON object per line with stable field names.", "text",
        choices=("text", "json"), group="Runtime")
    spark_log_level: str = setting(
        "SINK_SPARK_LOG_LEVEL", "Log level of Spark's own (JVM) logging.", "WARN",
        choices=("ERROR", "WARN", "INFO", "DEBUG"), group="Runtime")
    spark_class_archive: str = setting(
        "SINK_SPARK_CLASS_ARCHIVE", "JVM class-data archive that makes Spark start about 3 s faster: "
        "`auto` (the one `python -m sink_service.spark_home` builds inside the installation; "
        "`scripts/bootstrap.sh` and the Docker image run it), a file path, or `off`. "
        "A missing or outdated archive only makes start-up slower.", "auto", group="Runtime")
    shutdown_timeout_ms: int = setting(
        "SINK_SHUTDOWN_TIMEOUT_MS", "On SIGTERM, how long in-flight uploads may take to finish "
        "and commit before the service stops anyway.", 30_000, minimum=0, group="Runtime")
    restart_backoff_max_ms: int = setting(
        "SINK_RESTART_BACKOFF_MAX_MS", "Longest wait between replays of a failed micro-batch "
        "(backoff doubles from 1 s).", 60_000, minimum=1000, group="Runtime")
    scratch_dir: str = setting(
        "SINK_SCRATCH_DIR", "Local scratch space (Spark checkpoints, files being written). "
        "Nothing in it matters across restarts.", "/tmp/kafka-parquet-sink", group="Runtime")

    # Not declared: filled from SINK_KAFKA_<NAME> variables.
    kafka_options: Mapping[str, str] = field(default_factory=dict, metadata={"internal": True})

    # --- Derived values -----------------------------------------------------------------------
    def __post_init__(self) -> None:
        # A default that depends on another setting is resolved here, once: EMS tables are flat.
        if self.flatten is None:
            object.__setattr__(self, "flatten", self.target == "ems")

    def table_for(self, topic: str) -> str:
        return (self.ems_target_table or "{topic}").replace("{topic}", topic)

    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka settings shared by every client the service makes (SINK_KAFKA_* options included)."""
        return {"bootstrap.servers": self.kafka_bootstrap_servers, **self.kafka_options}

    def selected_metadata_columns(self) -> tuple[str, ...]:
        """SINK_METADATA_COLUMNS without `none`, which selects no column."""
        return tuple(name for name in self.metadata_columns if name != "none")

    def masked(self) -> dict[str, Any]:
        """Effective configuration with secrets masked, for the startup log."""
        dump: dict[str, Any] = {}
        for f in declared_fields():
            value = getattr(self, f.name)
            dump[f.metadata["env"]] = MASK if f.metadata["secret"] and value else _unless_in_url(value)
        for name, value in sorted(self.kafka_options.items()):
            env = KAFKA_PASSTHROUGH_PREFIX + name.upper().replace(".", "_")
            dump[env] = MASK if is_secret_kafka_option(name) else _unless_in_url(value)
        return dump


def _unless_in_url(value: Any) -> Any:
    """Credentials written into any URL-shaped text (`http://user:pass@proxy:3128`) are masked."""
    return mask_userinfo(value, MASK) if isinstance(value, str) else value


def declared_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(SinkConfig) if "env" in f.metadata]


def _declared_envs() -> set[str]:
    return {f.metadata["env"] for f in declared_fields()}


def is_secret_kafka_option(name: str) -> bool:
    """librdkafka's sensitive properties, plus anything named like a secret."""
    normalized = name.lower().replace("_", ".")
    return normalized in _SENSITIVE_KAFKA_OPTIONS or any(word in normalized.upper() for word in _SECRET_WORDS)


def kafka_passthrough(environ: Mapping[str, str]) -> dict[str, str]:
    """`SINK_KAFKA_SASL_MECHANISM=X` becomes librdkafka `sasl.mechanism=X`."""
    declared = _declared_envs()
    return {
        env[len(KAFKA_PASSTHROUGH_PREFIX):].lower().replace("_", "."): value
        for env, value in environ.items()
        if env.startswith(KAFKA_PASSTHROUGH_PREFIX) and env not in declared
    }


def _base_type(name: str) -> Any:
    """`int | None` -> int; `tuple[str, ...]` -> tuple."""
    annotation = typing.get_type_hints(SinkConfig)[name]
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return origin or annotation


def _parse_value(f: dataclasses.Field, raw: str) -> Any:
    kind = _base_type(f.name)
    meta = f.metadata
    if kind is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind is bool:
        if raw.strip().lower() not in ("true", "false"):
            raise ValueError(f"must be true or false, got {raw!r}")
        return raw.strip().lower() == "true"
    if kind is int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"must be a whole number, got {raw!r}") from None
        if meta["minimum"] is not None and value < meta["minimum"]:
            raise ValueError(f"must be at least {meta['minimum']}, got {value}")
        return value
    value = raw.strip()
    if meta["choices"] and value not in meta["choices"]:
        raise ValueError(f"must be one of {', '.join(meta['choices'])}; got {value!r}")
    return value


def load_config(environ: Mapping[str, str], *, scope: str = "service") -> SinkConfig:
    """Build and validate the configuration; raise `ConfigError` listing every problem.

    `scope="target"` is for tools that only upload or read files (the uploader CLI): the Kafka
    settings are not required then.
    """
    if scope not in ("service", "target"):
        raise ValueError(f"unknown configuration scope {scope!r}")
    checks = _CHECKS if scope == "service" else tuple(c for c in _CHECKS if c is not _check_kafka)
    problems: list[str] = []
    values: dict[str, Any] = {}
    for f in declared_fields():
        raw = environ.get(f.metadata["env"])
        if raw is None or raw.strip() == "":
            continue
        try:
            values[f.name] = _parse_value(f, raw)
        except ValueError as exc:
            shown = MASK if f.metadata["secret"] else raw
            problems.append(f"{f.metadata['env']}={shown!s}: {exc}")
    values["kafka_options"] = kafka_passthrough(environ)
    problems.extend(_unknown_names(environ))
    config = SinkConfig(**values)
    problems.extend(problem for check in checks for problem in check(config))
    if problems:
        raise ConfigError(problems)
    return config


def _unknown_names(environ: Mapping[str, str]) -> list[str]:
    """A misspelt name would otherwise run silently on the default. Values are not shown: a
    misspelt secret setting still holds the secret."""
    known = sorted(_declared_envs())
    problems = []
    for name in sorted(environ):
        if (not name.startswith("SINK_") or name.startswith(KAFKA_PASSTHROUGH_PREFIX)
                or name in known or name in NON_SETTING_NAMES):
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; see the configuration reference"
        problems.append(f"{name} is not a setting (value not shown){hint}")
    return problems


# --- Cross-field checks: each returns a list of problems ----------------------------------------

def _check_kafka(c: SinkConfig) -> list[str]:
    problems = []
    if not c.kafka_bootstrap_servers:
        problems.append("SINK_KAFKA_BOOTSTRAP_SERVERS is required, e.g. `broker-1:9092,broker-2:9092`.")
    if bool(c.topics) == bool(c.topic_pattern):
        problems.append("Set exactly one of SINK_TOPICS (comma list) or SINK_TOPIC_PATTERN (regex).")
    if c.topic_pattern:
        try:
            re.compile(c.topic_pattern)
        except re.error as exc:
            problems.append(f"SINK_TOPIC_PATTERN is not a valid regular expression: {exc}.")
    for reserved, why in RESERVED_KAFKA_OPTIONS.items():
        if reserved in c.kafka_options:
            env = KAFKA_PASSTHROUGH_PREFIX + reserved.upper().replace(".", "_")
            problems.append(f"{env} cannot be passed through; the service sets `{reserved}` itself: {why}.")
    return problems


def _is_loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def _check_parking(c: SinkConfig) -> list[str]:
    if c.rejected_file_policy != "park":
        return []
    if not c.parked_path:
        return ["SINK_PARKED_PATH is required when SINK_REJECTED_FILE_POLICY=park."]
    if c.parked_path.startswith(S3_URL_SCHEME):
        bucket = c.parked_path[len(S3_URL_SCHEME):].partition("/")[0]
        if not bucket:
            return [f"SINK_PARKED_PATH={c.parked_path} names no bucket; use `s3://<bucket>/<prefix>`."]
        return _check_s3_endpoint(c) if c.target != "s3" else []  # the S3 target's check covers it
    if "://" in c.parked_path:
        return [f"SINK_PARKED_PATH must be a directory or an `s3://<bucket>/<prefix>` URL, not "
                f"{c.parked_path.split('://')[0]}://."]
    return []


def _check_target(c: SinkConfig) -> list[str]:
    if c.target == "s3":
        return _check_s3(c)
    if c.target == "dir":
        return [] if c.dir_path else ["SINK_DIR_PATH is required when SINK_TARGET=dir."]
    problems = []
    if not c.ems_endpoint:
        problems.append("SINK_EMS_ENDPOINT is required when SINK_TARGET=ems.")
    else:
        url = urlsplit(c.ems_endpoint)
        if url.scheme not in ("https", "http") or not url.hostname:
            problems.append(f"SINK_EMS_ENDPOINT must be an https:// URL, got {mask_userinfo(c.ems_endpoint, MASK)!r}.")
        elif url.scheme == "http" and not _is_loopback(url.hostname):
            problems.append("SINK_EMS_ENDPOINT must use https; plain http is allowed only to a "
                            "loopback address (127.0.0.1, ::1, localhost).")
    if not c.ems_authorization:
        problems.append("SINK_EMS_AUTHORIZATION is required when SINK_TARGET=ems: "
                        "`AppKey <key>` or `Bearer <token>`.")
    elif not c.ems_authorization.startswith(("AppKey ", "Bearer ")):
        problems.append("SINK_EMS_AUTHORIZATION must start with `AppKey ` or `Bearer ` "
                        "(value not shown).")
    if c.ems_proxy_url and urlsplit(c.ems_proxy_url).scheme not in ("http", "https", "socks5", "socks5h"):
        problems.append("SINK_EMS_PROXY_URL must start with http://, https://, socks5:// or socks5h://.")
    if not c.ems_target_table:
        problems.append("SINK_EMS_TARGET_TABLE is required when SINK_TARGET=ems "
                        "(`{topic}` gives one table per topic).")
    return problems


def _check_s3(c: SinkConfig) -> list[str]:
    problems = []
    if not c.s3_bucket:
        problems.append("SINK_S3_BUCKET is required when SINK_TARGET=s3.")
    elif "/" in c.s3_bucket or c.s3_bucket.startswith("s3:"):
        problems.append(f"SINK_S3_BUCKET must be a bare bucket name, got {c.s3_bucket!r}; put a key "
                        "prefix in SINK_S3_PREFIX.")
    return problems + _check_s3_endpoint(c)


def _check_s3_endpoint(c: SinkConfig) -> list[str]:
    problems = []
    if c.s3_endpoint_url:
        url = urlsplit(c.s3_endpoint_url)
        if url.scheme not in ("https", "http") or not url.hostname:
            problems.append("SINK_S3_ENDPOINT_URL must be an http(s):// URL, e.g. `https://minio.internal:9000`.")
        elif url.password is not None:
            problems.append("SINK_S3_ENDPOINT_URL must not contain credentials (value not shown); "
                            "use boto3's credential chain, e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY.")
        elif url.scheme == "http" and not (c.s3_allow_http or _is_loopback(url.hostname)):
            problems.append("SINK_S3_ENDPOINT_URL uses plain http to a host that is not loopback, so files "
                            "would cross the network unencrypted; use https, or set SINK_S3_ALLOW_HTTP=true "
                            "if the network is trusted.")
    return problems


def _check_tls(c: SinkConfig) -> list[str]:
    """A wrong CA path would otherwise surface only at the first upload, on an executor."""
    if not c.tls_ca_bundle:
        return []
    try:
        ssl.create_default_context(cafile=c.tls_ca_bundle)
    except (OSError, ssl.SSLError) as exc:  # missing, unreadable, a directory, or no PEM certificate
        return [f"SINK_TLS_CA_BUNDLE={c.tls_ca_bundle} is not a readable PEM file of CA certificates: {exc}."]
    return []


def _check_dead_letters(c: SinkConfig) -> list[str]:
    if c.error_policy != "dlq":
        return [f"SINK_DLQ_TOPIC is set, but SINK_ERROR_POLICY={c.error_policy} sends nothing there; set "
                "SINK_ERROR_POLICY=dlq or remove it."] if c.dlq_topic else []
    if not c.dlq_topic:
        return ["SINK_DLQ_TOPIC is required when SINK_ERROR_POLICY=dlq."]
    consumed = c.dlq_topic in c.topics or (
        c.topic_pattern is not None and _fullmatch(c.topic_pattern, c.dlq_topic))
    if consumed:
        return [f"SINK_DLQ_TOPIC={c.dlq_topic} is one of the topics this service consumes: its bad records "
                "would come back to it forever. Use a topic outside SINK_TOPICS/SINK_TOPIC_PATTERN."]
    return []


def _fullmatch(pattern: str, text: str) -> bool:
    """Whether a (possibly invalid: reported by `_check_kafka`) pattern matches the whole text."""
    try:
        return re.fullmatch(pattern, text) is not None
    except re.error:
        return False


def _check_records(c: SinkConfig) -> list[str]:
    problems = []
    if c.value_schema and not c.transform_sql:  # with a transform, the keys name its output (`_check_transform`)
        # Declared schemas need pyarrow, which is not on the way to the JVM's launch otherwise.
        from sink_service.ddl import DdlError, parse_ddl

        try:
            schema = parse_ddl(c.value_schema)
        except DdlError as exc:
            return [f"SINK_VALUE_SCHEMA is not valid Spark DDL: {exc}."]
        from sink_service.column_names import METADATA_COLUMNS

        known = set(_declared_columns(schema, c)) | set(METADATA_COLUMNS)
        for key in c.primary_keys:
            if key not in known and c.key_format not in STRUCTURED_KEY_FORMATS:  # such keys bring fields
                problems.append(f"SINK_PRIMARY_KEYS names `{key}`, which SINK_VALUE_SCHEMA does not declare.")
        if c.order_field not in known:
            problems.append(f"SINK_ORDER_FIELD names `{c.order_field}`, which SINK_VALUE_SCHEMA does not declare.")
    if len(set(c.primary_keys)) != len(c.primary_keys):
        problems.append("SINK_PRIMARY_KEYS lists a field twice.")
    return problems


def _declared_columns(schema: Any, c: SinkConfig) -> list[str]:
    """The columns a declared value schema gives: its fields, or their flattened names."""
    if not c.flatten:
        return schema.names
    from sink_service.decode.flatten import flatten

    return flatten(schema.empty_table(), metadata=(), discard_collections=c.flatten_discard_collections,
                   lowercase=c.lowercase_fields, decimals_as_double=False).column_names


def _check_row_shape(c: SinkConfig) -> list[str]:
    from sink_service.column_names import column_name

    problems = []
    if c.flatten:
        rule = "only [A-Za-z0-9_]" + (", lowercase" if c.lowercase_fields else "")
        for env, names in (("SINK_PRIMARY_KEYS", c.primary_keys), ("SINK_ORDER_FIELD", (c.order_field,))):
            for name in names:
                column = column_name([name], lowercase=c.lowercase_fields)
                if column != name:
                    problems.append(f"{env} names `{name}`, which no flattened column is called (names hold "
                                    f"{rule}); did you mean `{column}`?")
    else:
        flat_only = (("SINK_FLATTEN_DISCARD_COLLECTIONS", c.flatten_discard_collections),
                     ("SINK_LOWERCASE_FIELDS", c.lowercase_fields), ("SINK_DECIMALS_AS_DOUBLE", c.decimals_as_double))
        problems += [f"{env}=true acts only on flattened rows; set SINK_FLATTEN=true (its default only with "
                     "SINK_TARGET=ems)." for env, on in flat_only if on]
    return problems + _check_obfuscation(c)


def _check_obfuscation(c: SinkConfig) -> list[str]:
    from sink_service.column_names import column_name

    hashing = c.obfuscation_method != "fix"
    problems = []
    if c.obfuscation_salt and not hashing:
        problems.append("SINK_OBFUSCATION_SALT is set, but SINK_OBFUSCATION_METHOD=fix uses no salt; "
                        "set SINK_OBFUSCATION_METHOD=sha512 (or sha1) to hash.")
    if c.obfuscate_fields and hashing and not c.obfuscation_salt:
        problems.append(f"SINK_OBFUSCATION_SALT is required with SINK_OBFUSCATION_METHOD={c.obfuscation_method}: "
                        "an unsalted hash of an e-mail address or a phone number is undone by hashing likely values.")
    if len(set(c.obfuscate_fields)) != len(c.obfuscate_fields):
        problems.append("SINK_OBFUSCATE_FIELDS lists a path twice.")
    for path in c.obfuscate_fields:
        steps = path.split(".")
        column = column_name(steps, lowercase=c.lowercase_fields) if c.flatten else path
        if not all(steps):
            problems.append(f"SINK_OBFUSCATE_FIELDS has `{path}`; a path is field names joined by `.`, "
                            "e.g. `customer.email`.")
        elif steps[0] == "_offset":
            problems.append("SINK_OBFUSCATE_FIELDS names `_offset`: the Kafka offset names files and "
                            "commits, and holds nothing to hide.")
        elif column == c.order_field:
            problems.append(f"SINK_OBFUSCATE_FIELDS names `{path}`, the order field (SINK_ORDER_FIELD): an "
                            "obfuscated value cannot order the versions of a key.")
        elif column in c.primary_keys and not hashing:
            problems.append(f"SINK_OBFUSCATE_FIELDS names `{path}`, a primary key (SINK_PRIMARY_KEYS): `fix` "
                            "would give every record the same key. Use SINK_OBFUSCATION_METHOD=sha512, which "
                            "hashes keys consistently, or leave the key out.")
    return problems


def _check_keys_and_metadata(c: SinkConfig) -> list[str]:
    from sink_service.column_names import METADATA_COLUMNS

    problems = []
    for name in c.metadata_columns:
        if name not in (*METADATA_COLUMNS, "none"):
            problems.append(f"SINK_METADATA_COLUMNS names `{name}`; choose from {', '.join(METADATA_COLUMNS)}, "
                            "or `none`.")
    if "none" in c.metadata_columns and len(c.metadata_columns) > 1:
        problems.append("SINK_METADATA_COLUMNS lists `none` beside columns; give either.")
    if c.key_fields_prefix and c.key_format not in STRUCTURED_KEY_FORMATS:
        problems.append("SINK_KEY_FIELDS_PREFIX applies only to JSON key fields; set SINK_KEY_FORMAT=json or "
                        "remove it.")
    if c.tombstones == "soft-delete":
        problems += _check_soft_delete(c, METADATA_COLUMNS)
    return problems


def _check_soft_delete(c: SinkConfig, metadata: tuple[str, ...]) -> list[str]:
    """A tombstone has no value: its row holds only the key's fields and metadata, which must place it."""
    problems = []
    if not c.primary_keys and c.key_format not in STRUCTURED_KEY_FORMATS:
        problems.append("SINK_TOMBSTONES=soft-delete needs primary keys a tombstone carries: set "
                        "SINK_KEY_FORMAT=json (the key's fields are then the primary keys) or SINK_PRIMARY_KEYS=_key.")
    elif c.key_format not in STRUCTURED_KEY_FORMATS and set(c.primary_keys) != {"_key"}:
        problems.append("SINK_TOMBSTONES=soft-delete: a tombstone carries only its key, so SINK_PRIMARY_KEYS must "
                        "be `_key` or fields of a JSON key (SINK_KEY_FORMAT=json).")
    if c.order_field not in metadata:
        problems.append(f"SINK_TOMBSTONES=soft-delete: SINK_ORDER_FIELD=`{c.order_field}` is a value field, which a "
                        "tombstone does not have; use `_offset` or `_timestamp`.")
    return problems


def _check_formats(c: SinkConfig) -> list[str]:
    """Value and key formats against the settings they need or exclude."""
    problems = []
    registry_formats = sorted({f"{env}={fmt}" for env, fmt in (("SINK_VALUE_FORMAT", c.value_format),
                               ("SINK_KEY_FORMAT", c.key_format)) if fmt in REGISTRY_FORMATS})
    if registry_formats and not c.schema_registry_url:
        problems.append(f"SINK_SCHEMA_REGISTRY_URL is required with {' and '.join(registry_formats)}.")
    if not registry_formats and (c.schema_registry_url or c.schema_registry_basic_auth):
        problems.append("SINK_SCHEMA_REGISTRY_URL/SINK_SCHEMA_REGISTRY_BASIC_AUTH are set, but no format reads "
                        "from a registry: set SINK_VALUE_FORMAT or SINK_KEY_FORMAT to avro or protobuf.")
    if c.schema_registry_url and urlsplit(c.schema_registry_url).scheme not in ("http", "https"):
        problems.append(f"SINK_SCHEMA_REGISTRY_URL must be an http(s):// URL, got "
                        f"{mask_userinfo(c.schema_registry_url, MASK)!r}.")
    if c.schema_registry_basic_auth and ":" not in c.schema_registry_basic_auth:
        problems.append("SINK_SCHEMA_REGISTRY_BASIC_AUTH must be `user:password` (value not shown).")
    if c.value_schema and c.value_format != "json":
        problems.append(f"SINK_VALUE_SCHEMA declares a JSON value's fields; with SINK_VALUE_FORMAT={c.value_format} "
                        "the schema comes from the format itself: unset SINK_VALUE_SCHEMA.")
    return problems + _check_csv(c)


def csv_character(value: str | None, default: str) -> str:
    """SINK_CSV_DELIMITER/SINK_CSV_QUOTE as the character meant: `\\t` is a tab (settings are stripped)."""
    return default if value is None else "\t" if value == "\\t" else value


def _check_csv(c: SinkConfig) -> list[str]:
    settings = (("SINK_CSV_COLUMNS", c.csv_columns), ("SINK_CSV_HEADER", c.csv_header),
                ("SINK_CSV_DELIMITER", c.csv_delimiter), ("SINK_CSV_QUOTE", c.csv_quote))
    options = [env for env, value in settings if value]
    if c.value_format != "csv":
        return [f"{', '.join(options)} apply only to CSV values; set SINK_VALUE_FORMAT=csv or unset them."] \
            if options else []
    problems = []
    if not c.csv_columns and not c.csv_header:
        problems.append("SINK_VALUE_FORMAT=csv needs SINK_CSV_COLUMNS (Spark DDL, e.g. `id BIGINT, name STRING`) "
                        "or SINK_CSV_HEADER=true.")
    if c.csv_columns:
        from sink_service.ddl import DdlError, parse_ddl

        try:
            schema = parse_ddl(c.csv_columns)
        except DdlError as exc:
            problems.append(f"SINK_CSV_COLUMNS is not valid Spark DDL: {exc}.")
        else:
            nested = [f.name for f in schema if f.type.num_fields or str(f.type).startswith(("list", "map"))]
            if nested:
                problems.append(f"SINK_CSV_COLUMNS declares {', '.join(nested)} as STRUCT, ARRAY or MAP; a CSV "
                                "field holds a single value.")
    for env, value in (("SINK_CSV_DELIMITER", c.csv_delimiter), ("SINK_CSV_QUOTE", c.csv_quote)):
        if value is not None and (len(csv_character(value, "")) != 1 or value in "\r\n"):
            problems.append(f"{env} must be one character other than a line break (`\\t` for a tab), got {value!r}.")
    if csv_character(c.csv_delimiter, ",") == csv_character(c.csv_quote, '"'):
        problems.append("SINK_CSV_DELIMITER and SINK_CSV_QUOTE must differ.")
    return problems


def transform_for(c: SinkConfig) -> Transform | None:
    """SINK_TRANSFORM_SQL compiled for the rows this configuration decodes; raises `TransformInvalid`."""
    if not c.transform_sql:
        return None
    from sink_service.column_names import METADATA_COLUMNS
    from sink_service.transform_sql import compile_transform

    columns, complete = _transform_input(c)
    return compile_transform(c.transform_sql, order_field=c.order_field, primary_keys=c.primary_keys,
                             columns=columns, complete=complete, reserved=METADATA_COLUMNS, flat=bool(c.flatten))


def _transform_input(c: SinkConfig) -> tuple[pa.Schema, bool]:
    """The columns the statement's input is known to have, and whether they are all: a declared
    JSON schema's fields (flattened as configured) and the metadata columns written. Without a
    declared schema, or with a key whose fields become columns, other columns may arrive."""
    import pyarrow as pa

    from sink_service.ddl import DdlError, parse_ddl
    from sink_service.decode.flatten import flatten
    from sink_service.decode.metadata import with_metadata, written_metadata
    from sink_service.decode.raw import RAW_SCHEMA
    from sink_service.decode.tombstones import with_deleted

    fields, complete = pa.table({}), False
    if c.value_schema and c.value_format == "json":
        with contextlib.suppress(DdlError):  # reported by `_check_records`
            fields, complete = parse_ddl(c.value_schema).empty_table(), c.key_format not in STRUCTURED_KEY_FORMATS
    if c.flatten:
        fields = flatten(fields, metadata=(), discard_collections=c.flatten_discard_collections,
                         lowercase=c.lowercase_fields, decimals_as_double=c.decimals_as_double)
    if c.tombstones == "soft-delete":
        fields = with_deleted(fields, False)
    written = written_metadata(c.selected_metadata_columns(), c.order_field, c.primary_keys)
    rows = with_metadata(fields, pa.RecordBatch.from_pylist([], schema=RAW_SCHEMA), written, c.key_format)
    return rows.schema, complete


def _check_transform(c: SinkConfig) -> list[str]:
    if not c.transform_sql:
        return []  # and sqlglot (~0.1 s) stays unimported, on the way to the JVM's start
    from sink_service.transform_sql import TransformInvalid

    try:
        transform_for(c)
    except TransformInvalid as exc:
        return exc.problems
    return []


def _check_cluster(c: SinkConfig) -> list[str]:
    """Upload credentials travel to executors in task specs: never over unauthenticated plain RPC."""
    if c.spark_master.startswith("spark://") and not c.spark_auth_secret:
        return ["SINK_SPARK_MASTER is a standalone cluster, so SINK_SPARK_AUTH_SECRET is required: task specs "
                "carry upload credentials to executors, and Spark's RPC is authenticated and encrypted with it. "
                "Give the master and workers the same secret (SPARK_MASTER_OPTS/SPARK_WORKER_OPTS="
                "'-Dspark.authenticate=true -Dspark.authenticate.secret=...')."]
    return []


_CHECKS: tuple[Callable[[SinkConfig], list[str]], ...] = (
    _check_kafka, _check_target, _check_parking, _check_tls, _check_dead_letters, _check_records, _check_row_shape,
    _check_keys_and_metadata, _check_cluster, _check_formats, _check_transform)


def reference_markdown() -> str:
    """The README's configuration reference, generated from the declarations."""
    lines: list[str] = []
    group = None
    for f in declared_fields():
        meta = f.metadata
        if meta["group"] != group:
            group = meta["group"]
            lines += ["", f"#### {group}", "", "| Variable | Default | Description |", "|---|---|---|"]
        default = f.default
        if isinstance(default, tuple):
            default = ",".join(default)
        if isinstance(default, bool):
            default = str(default).lower()
        shown = "" if default in (None, "") else f"`{default}`"
        doc = meta["doc"]
        if meta["choices"]:
            doc += " One of: " + ", ".join(f"`{c}`" for c in meta["choices"]) + "."
        if meta["secret"]:
            doc += " **Secret**: masked in logs."
        lines.append(f"| `{meta['env']}` | {shown} | {doc} |")
    lines += [
        "",
        "#### Kafka client pass-through",
        "",
        "Any other `SINK_KAFKA_<NAME>` is passed to librdkafka as `<name>` lowercased with `_` "
        "turned into `.`, e.g. `SINK_KAFKA_SECURITY_PROTOCOL=SASL_SSL`, "
        "`SINK_KAFKA_SASL_MECHANISM=SCRAM-SHA-512`, `SINK_KAFKA_SASL_USERNAME`, "
        "`SINK_KAFKA_SASL_PASSWORD`. librdkafka's sensitive properties (passwords, `ssl.key.pem`, "
        "`sasl.oauthbearer.config`, ...) and names containing PASSWORD, SECRET, TOKEN or CREDENTIAL "
        "are secret and masked in logs. The service sets "
        + ", ".join(f"`{name}`" for name in RESERVED_KAFKA_OPTIONS)
        + " itself: passing one through is a configuration error (exit 2) that says why.",
    ]
    return "\n".join(lines).lstrip("\n") + "\n"


README_START, README_END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def with_reference(readme: str) -> str:
    """The README text with its configuration reference block regenerated."""
    head, rest = readme.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_START}\n{reference_markdown()}{README_END}{tail}"


if __name__ == "__main__":  # python -m sink_service.config: regenerate the README's reference
    from pathlib import Path

    readme = Path(__file__).resolve().parents[1] / "README.md"
    readme.write_text(with_reference(readme.read_text()))
