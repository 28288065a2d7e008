"""Records and row shape: formats, keys, metadata, bad records, flattening, obfuscation, the transform."""

from __future__ import annotations

from dataclasses import dataclass

from sink_service.config.declare import setting
from sink_service.shared.column_names import DEFAULT_METADATA_COLUMNS

STRUCTURED_KEY_FORMATS = ("json", "avro", "protobuf")  # keys whose fields become columns (decode/keys.py)
REGISTRY_FORMATS = ("avro", "protobuf")  # formats whose schemas come from SINK_SCHEMA_REGISTRY_URL


@dataclass(frozen=True)
class DecodeSettings:
    """Records and row shape: part of `SinkConfig`."""

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
        "SINK_ERROR_POLICY", "Records that cannot be decoded or lack a primary key, or hold a value the "
        "Delta table's column cannot take (text in a number column): `fail` stops "
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

    transform_sql: str | None = setting(
        "SINK_TRANSFORM_SQL", "A Spark SQL `SELECT … FROM records` run over the decoded rows (after "
        "flattening and obfuscation), e.g. `SELECT id, CAST(amount AS DECIMAL(10,2)) AS amount, upper(status) "
        "AS status FROM records WHERE status <> 'test'`: rename, filter, compute or cast columns. Row-wise only "
        "(no joins, aggregates, windows, subqueries, ORDER BY or LIMIT). `SINK_PRIMARY_KEYS` and "
        "`SINK_ORDER_FIELD` name its output columns; `_offset` is carried through. A record it fails on (e.g. "
        "a CAST that does not convert) is a bad record (`transform_failed`); records its WHERE leaves out are "
        "committed, not written. See \"Transform\".",
        group="Transform")


def csv_character(value: str | None, default: str) -> str:
    """SINK_CSV_DELIMITER/SINK_CSV_QUOTE as the character meant: `\\t` is a tab (settings are stripped)."""
    return default if value is None else "\t" if value == "\\t" else value
