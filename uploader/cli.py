"""`python -m uploader`: push one Parquet file by hand, or read back what a dir/S3 target holds.

    python -m uploader push FILE|s3://BUCKET/KEY [--target ems|s3|dir] [--topic T --partition P --first-offset F
                                  --last-offset L] [--table NAME] [--primary-keys a,b]
                                  [--order-column C] [--dry-run]
    python -m uploader read [--target dir|s3] [--primary-keys id] [--order-column _offset]
                            [--format jsonl|csv|table]

The target is configured by the same SINK_* variables as the service (see the README's reference);
Kafka settings are not needed. Topic, partition and offsets default to what the service's file name
says (`topic-<t>_partition-<p>_firstOffset-<f>_lastOffset-<l>.parquet`, or the dir/S3 targets'
`<topic>/<partition>/<first>-<last>.parquet` path or `s3://` URL); the record count and schema
fingerprint come from the Parquet footer. A parked file (SINK_PARKED_PATH) is pushed with the metadata
of the `.response.json` beside it; one parked in S3 is named by its `s3://` URL and downloaded first.

Exit codes: 0 ok, 2 usage or configuration error, 3 the target rejected the upload (retrying cannot
help; the message names the setting to fix), 4 a transient error outlasted the retry budget
(SINK_UPLOAD_RETRY_BUDGET_MS). Credentials are never printed.

The SINK_* configuration is the service's: its distribution plugs it in through the
`uploader.config` entry point (see `_service`), so the uploader imports nothing of it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import datetime
import decimal
import io
import json
import logging
import os
import pathlib
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

import pyarrow as pa

from uploader.errors import FatalUploadError, RetryableUploadError
from uploader.masking import authorization_secrets, redact
from uploader.parking import SIDECAR_SUFFIX, ParkingSettings, read_sidecar_metadata, sidecar_path
from uploader.parquet_info import RangeName, footer_info, parse_file_name
from uploader.retry import RetryPolicy
from uploader.s3 import S3Target
from uploader.target import FileMetadata, Receipt

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FATAL = 3
EXIT_RETRYABLE = 4
PROG = "python -m uploader"


class UsageError(Exception):
    """Bad arguments or configuration: exit code 2."""


CONFIG_ENTRY_POINTS = "uploader.config"  # the distribution that declares SINK_* registers its module here


def _service(*names: str) -> tuple[Any, ...]:
    """Names of the SINK_* configuration, from the module its distribution registers under the
    `uploader.config` entry point (this project's pyproject.toml: `sink_service.config.for_uploader`): the
    uploader imports nothing of the service; the service plugs its configuration in."""
    from importlib.metadata import entry_points

    found = sorted(entry_points(group=CONFIG_ENTRY_POINTS), key=lambda ep: ep.name)
    if not found:
        raise UsageError("no SINK_* configuration is installed (entry point group uploader.config); "
                         "install the service: pip install -e .")
    module = found[0].load()
    return tuple(getattr(module, name) for name in names)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Push a Parquet file to the configured target, or read back a dir/S3 target. "
        "Configured by the service's SINK_* environment variables.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log retries (-v) or every request (-vv)")
    commands = parser.add_subparsers(dest="command", required=True)

    push = commands.add_parser("push", help="upload one Parquet file, with the service's retries")
    push.add_argument("file", help="the Parquet file, or the s3:// URL of one parked in S3")
    push.add_argument("--target", choices=("ems", "s3", "dir"), help="default: SINK_TARGET")
    push.add_argument("--topic", help="default: from the file name")
    push.add_argument("--partition", type=int, help="default: from the file name")
    push.add_argument("--first-offset", type=int, help="default: from the file name")
    push.add_argument("--last-offset", type=int, help="default: from the file name")
    push.add_argument("--table", help="EMS targetName; default: SINK_EMS_TARGET_TABLE with {topic} filled in")
    push.add_argument("--primary-keys", help="comma-separated; default: SINK_PRIMARY_KEYS")
    push.add_argument("--order-column", help="default: SINK_ORDER_FIELD")
    push.add_argument("--dry-run", action="store_true", help="print the request that would be sent; send nothing")

    read = commands.add_parser("read", help="print the latest row per primary key of a dir or S3 target")
    read.add_argument("--target", choices=("dir", "s3"), help="default: SINK_TARGET")
    read.add_argument("--primary-keys", help="comma-separated; default: SINK_PRIMARY_KEYS; none: every row")
    read.add_argument("--order-column", help="default: SINK_ORDER_FIELD")
    read.add_argument("--format", choices=("jsonl", "csv", "table"), default="jsonl")
    return parser


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    environ = os.environ if environ is None else environ
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    parser = build_parser()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage already
        return EXIT_USAGE if exc.code else EXIT_OK
    secrets: tuple[str, ...] = ()

    def say(stream: TextIO, text: str) -> None:
        print(redact(text, secrets), file=stream)

    try:
        config = _load_config(environ, args.target, getattr(args, "table", None))
        secrets = _config_secrets(config)
        with _logging_to(err, args.verbose, secrets):
            if args.command == "push":
                return _push(args, config, lambda text: say(out, text))
            return _read(args, config, out)
    except UsageError as exc:
        say(err, f"{PROG}: {exc}")
        return EXIT_USAGE
    except FatalUploadError as exc:
        hint = f" [setting: {exc.setting}]" if exc.setting else ""
        say(err, f"{PROG}: rejected, not retried{hint}: {exc}")
        return EXIT_FATAL
    except RetryableUploadError as exc:
        say(err, f"{PROG}: failed after retrying: {exc}")
        return EXIT_RETRYABLE


# --- configuration --------------------------------------------------------------------------------


def _load_config(environ: Mapping[str, str], target: str | None, table: str | None) -> Any:
    """The service's configuration, checked as far as an upload needs it; flags win over SINK_*."""
    ConfigError, load_config = _service('ConfigError', 'load_config')

    env = dict(environ)
    if target:
        env["SINK_TARGET"] = target
    if table:
        env["SINK_EMS_TARGET_TABLE"] = table
    try:
        return load_config(env, scope="target")
    except ConfigError as exc:
        raise UsageError(f"{exc}\nSee the configuration reference in README.md.") from None


def _config_secrets(config: Any) -> tuple[str, ...]:
    declared_fields, = _service('declared_fields')

    values: list[str] = []
    for f in declared_fields():
        value = getattr(config, f.name)
        if f.metadata["secret"] and value:
            values += authorization_secrets(value) if f.name == "ems_authorization" else [value]
    return tuple(values)


class _RedactingFilter(logging.Filter):
    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage(), self._secrets), ()
        return True


@contextlib.contextmanager
def _logging_to(stream: TextIO, verbose: int, secrets: tuple[str, ...]) -> Iterator[None]:
    """The uploader's log lines (retries, -v: requests) on `stream`, secrets masked; undone afterwards."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RedactingFilter(secrets))
    logger = logging.getLogger("uploader")
    saved = logger.level, logger.propagate
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG))
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _settings_for(config: Any) -> Any:
    target_settings, = _service('target_settings')

    try:
        settings = target_settings(config)
    except ValueError as exc:  # settings validation: names the setting, never the secret value
        raise UsageError(str(exc)) from None
    # By hand, a rejection is reported, never parked: the person pushing is the one to act on it.
    return settings.inner if isinstance(settings, ParkingSettings) else settings


def _target_for(config: Any) -> Any:
    build_target, = _service('build_target')

    return build_target(_settings_for(config))


def _keys(option: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if option is None:
        return tuple(default)
    return tuple(key.strip() for key in option.split(",") if key.strip())


# --- push -----------------------------------------------------------------------------------------


# The dir and S3 targets' names (FileMetadata.object_key): `<topic>/<partition>/<first:020d>-<last:020d>.parquet`.
_TARGET_NAME = re.compile(r"(?:^|/)(?P<topic>[^/]+)/(?P<partition>\d+)/(?P<first>\d+)-(?P<last>\d+)\.parquet$")


def range_name(source: str) -> RangeName | None:
    """Topic, partition and offsets from a file's name (EMS style) or from its path or `s3://` URL as
    the dir and S3 targets write it; None when neither shape fits."""
    parsed = parse_file_name(source)
    if parsed is not None:
        return parsed
    match = _TARGET_NAME.search(source.replace("\\", "/"))
    if match is None:
        return None
    return RangeName(match["topic"], int(match["partition"]), int(match["first"]), int(match["last"]))


def file_metadata(path: pathlib.Path, args: argparse.Namespace, config: Any, source: str | None = None) -> FileMetadata:
    """Metadata for a file pushed by hand: flags win over the name; counts from the footer.

    `source` is the name the operator gave (an `s3://` URL is pushed from a downloaded copy whose
    local path no longer holds the `<topic>/<partition>/` folders)."""
    parsed = range_name(source if source is not None else str(path))
    fields = {
        "topic": args.topic if args.topic is not None else parsed and parsed.topic,
        "partition": args.partition if args.partition is not None else parsed and parsed.partition,
        "first_offset": args.first_offset if args.first_offset is not None else parsed and parsed.first_offset,
        "last_offset": args.last_offset if args.last_offset is not None else parsed and parsed.last_offset,
    }
    missing = [name for name, value in fields.items() if value is None]
    if missing:
        flags = ", ".join("--" + name.replace("_", "-") for name in missing)
        raise UsageError(
            f"cannot tell {', '.join(missing)} from the file name {path.name!r} (expected "
            f"topic-<t>_partition-<p>_firstOffset-<f>_lastOffset-<l>.parquet, or the dir/S3 targets' "
            f"<topic>/<partition>/<first>-<last>.parquet); pass {flags}"
        )
    if fields["first_offset"] > fields["last_offset"]:
        raise UsageError(f"first offset {fields['first_offset']} is after last offset {fields['last_offset']}")
    try:
        footer = footer_info(path)
    except (pa.ArrowException, OSError) as exc:
        raise UsageError(f"{path} is not a readable Parquet file: {exc}") from None
    return FileMetadata(
        topic=fields["topic"],
        partition=fields["partition"],
        first_offset=fields["first_offset"],
        last_offset=fields["last_offset"],
        record_count=footer.record_count,
        target_table=args.table or config.table_for(fields["topic"]),
        primary_keys=_keys(args.primary_keys, config.primary_keys),
        order_column=args.order_column or config.order_field,
        schema_fingerprint=footer.schema_fingerprint,
    )


@contextlib.contextmanager
def _local_copy(source: str, config: Any) -> Iterator[pathlib.Path]:
    """A local path as it is; an `s3://` one (a parked file) downloaded with its sidecar, if any, using
    the S3 target's endpoint, region, CA bundle and credentials."""
    S3_URL_SCHEME, = _service('S3_URL_SCHEME')
    s3_settings, = _service('s3_settings')

    if not source.startswith(S3_URL_SCHEME):
        yield pathlib.Path(source)
        return
    bucket, _, key = source[len(S3_URL_SCHEME):].partition("/")
    if not bucket or not key or key.endswith("/"):
        raise UsageError(f"{source} is not an s3://<bucket>/<key> URL of a file")
    store = S3Target(s3_settings(config, bucket, "", RetryPolicy()))
    try:
        with tempfile.TemporaryDirectory() as temp:
            local = pathlib.Path(temp) / pathlib.PurePosixPath(key).name
            if not store.download(key, local):
                raise UsageError(f"no such object: {source}")
            store.download(key + SIDECAR_SUFFIX, sidecar_path(local))
            yield local
    finally:
        store.close()


def _push(args: argparse.Namespace, config: Any, say) -> int:
    with _local_copy(args.file, config) as path:
        return _push_file(path, args, config, say)


def _push_file(path: pathlib.Path, args: argparse.Namespace, config: Any, say) -> int:
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    # A parked file's sidecar holds the metadata it was first pushed with; flags do not apply then.
    metadata = read_sidecar_metadata(path) or file_metadata(path, args, config, args.file)
    target = _target_for(config)
    try:
        if args.dry_run:
            described = {
                "dry_run": True,
                "target": target.name,
                "metadata": dataclasses.asdict(metadata),
                "request": target.describe_request(path, metadata),
            }
            say(json.dumps(described, indent=2, default=str))
            return EXIT_OK
        receipt = target.upload(path, metadata)
    finally:
        target.close()
    say(json.dumps(receipt_json(receipt), default=str))
    return EXIT_OK


def receipt_json(receipt: Receipt) -> dict[str, Any]:
    shown = dataclasses.asdict(receipt)
    shown["duration_s"] = round(receipt.duration_s, 3)
    shown["details"] = dict(receipt.details)
    return shown


# --- read -----------------------------------------------------------------------------------------


def _read(args: argparse.Namespace, config: Any, out: TextIO) -> int:
    import botocore.exceptions

    from uploader.reader import latest_rows
    from uploader.s3 import classify_error

    if config.target not in ("dir", "s3"):
        raise UsageError(f"read works with --target dir or s3, not {config.target!r}")
    settings = _settings_for(config)
    primary_keys = _keys(args.primary_keys, config.primary_keys)
    order_column = args.order_column or config.order_field
    try:
        table = latest_rows(settings, primary_keys, order_column)
    except (FileNotFoundError, ValueError) as exc:  # no such directory; a named column is missing
        raise UsageError(str(exc)) from None  # (pyarrow's ArrowInvalid, e.g. clashing schemas, is a ValueError)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise classify_error(exc, what=f"reading {settings.uri(settings.prefix)}") from exc
    write_table(table, args.format, out)
    return EXIT_OK


def write_table(table: pa.Table, fmt: str, out: TextIO) -> None:
    if fmt == "csv":
        import pyarrow.csv

        buffer = io.BytesIO()
        try:
            pyarrow.csv.write_csv(table, buffer)
        except pa.ArrowNotImplementedError as exc:
            raise UsageError(f"CSV cannot hold these columns ({exc}); use --format jsonl") from None
        out.write(buffer.getvalue().decode())
        return
    rows = table.to_pylist()
    if fmt == "jsonl":
        for row in rows:
            out.write(json.dumps(row, default=_json_value, ensure_ascii=False) + "\n")
        return
    names = table.column_names
    cells = [[_cell(row[name]) for name in names] for row in rows]
    widths = [max([len(name), *(len(line[i]) for line in cells)]) for i, name in enumerate(names)]
    for line in [names, ["-" * w for w in widths], *cells]:
        out.write("  ".join(value.ljust(width) for value, width in zip(line, widths, strict=True)).rstrip() + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return str(value)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, default=_json_value, ensure_ascii=False)
    return str(value)
