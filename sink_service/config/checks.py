"""The cross-field checks: each reads a whole `SinkConfig` and returns a list of problems."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sink_service.config.declare import MASK
from sink_service.config.decode import REGISTRY_FORMATS, STRUCTURED_KEY_FORMATS, csv_character
from sink_service.config.kafka import KAFKA_PASSTHROUGH_PREFIX, RESERVED_KAFKA_OPTIONS, starting_offsets_problems
from sink_service.config.target import S3_URL_SCHEME, check_delta
from uploader.masking import mask_userinfo

if TYPE_CHECKING:
    import pyarrow as pa

    from sink_service.config.settings import SinkConfig
    from sink_service.transform.rows import Transform


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
    problems.extend(starting_offsets_problems(c.starting_offsets))
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
    if c.target == "delta":
        return check_delta(c) + (_check_s3_endpoint(c) if (c.delta_table_uri or "").startswith(S3_URL_SCHEME) else [])
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
        from sink_service.shared.ddl import DdlError, parse_ddl

        try:
            schema = parse_ddl(c.value_schema)
        except DdlError as exc:
            return [f"SINK_VALUE_SCHEMA is not valid Spark DDL: {exc}."]
        from sink_service.shared.column_names import METADATA_COLUMNS

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
    from sink_service.shared.column_names import column_name

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
    from sink_service.shared.column_names import column_name

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
    from sink_service.shared.column_names import METADATA_COLUMNS

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
        from sink_service.shared.ddl import DdlError, parse_ddl

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
    from sink_service.shared.column_names import METADATA_COLUMNS
    from sink_service.transform.check import compile_transform

    columns, complete = _transform_input(c)
    return compile_transform(c.transform_sql, order_field=c.order_field, primary_keys=c.primary_keys,
                             columns=columns, complete=complete, reserved=METADATA_COLUMNS, flat=bool(c.flatten))


def _transform_input(c: SinkConfig) -> tuple[pa.Schema, bool]:
    """The columns the statement's input is known to have, and whether they are all: a declared
    JSON schema's fields (flattened as configured) and the metadata columns written. Without a
    declared schema, or with a key whose fields become columns, other columns may arrive."""
    import pyarrow as pa

    from sink_service.decode.flatten import flatten
    from sink_service.decode.metadata import with_metadata, written_metadata
    from sink_service.decode.raw import RAW_SCHEMA
    from sink_service.decode.tombstones import with_deleted
    from sink_service.shared.ddl import DdlError, parse_ddl

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
    from sink_service.transform.check import TransformInvalid

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
