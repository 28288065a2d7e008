"""The target side: what the target holds, as local Parquet files duckdb can read.

- `dir` and `s3`: the files under `<root or prefix>/<topic>/<partition>/<first>-<last>.parquet`
  (`FileMetadata.object_key`). A file of a partition without a committed offset, or that starts at or
  after the committed offset, was uploaded but not committed yet (the service uploads first, commits
  after): it is left out and counted, as the topic side reads only up to the committed offsets. S3
  objects are downloaded to the temporary directory one at a time: disk, not memory.
- `ems` at a `local_ems`: its table, read through its `/_control/tables/<name>` endpoint.
- `ems` anywhere else: the continuous-push API has no read-back, so the operator exports the table
  as Parquet and names it with `--target-export`.
- `delta`: the table's current version, read with deltalake in batches and spilled to one Parquet
  file. The table holds the latest row per key already; rows of ranges it applied past Kafka's
  committed offsets (it commits first) show as `ahead` when a record past them holds them.
Each file keeps its origin (topic, partition, first offset) so an upsert engine's order can be
replayed: the highest order value wins, ties go to the later file and the later row.
"""

from __future__ import annotations

import ipaddress
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from sink_service.config import SinkConfig
from sink_service.config.upload_targets import s3_settings
from uploader.retry import RetryPolicy

TP = tuple[str, int]
_FILE_NAME = re.compile(r"^(?P<first>\d{20})-(?P<last>\d{20})\.parquet$")


NO_READ_BACK = ("SINK_TARGET=ems: the EMS continuous-push API has no read-back, so verify cannot read the table. "
                "Export the table as Parquet files (e.g. with a data job) and pass --target-export PATH.")


class CannotVerify(Exception):
    """Verifying cannot start or finish as configured: exit 2, with what to do instead."""


class TargetUnreadable(CannotVerify):
    """The target cannot be read back."""


@dataclass(frozen=True)
class TargetFile:
    path: Path
    topic: str = ""
    partition: int = -1
    first_offset: int = -1  # the file's place in upload order; -1: unknown (an export, an EMS table)
    where: str = ""  # shown in examples: a path, an S3 URI or the EMS table


@dataclass
class TargetRows:
    files: list[TargetFile] = field(default_factory=list)
    described: str = ""
    uncommitted_files: int = 0  # uploaded past the committed offsets: not compared
    notes: list[str] = field(default_factory=list)


def _layout_file(relative: str) -> tuple[str, int, int] | None:
    """(topic, partition, first offset) of `<topic>/<partition>/<first>-<last>.parquet`, else None."""
    parts = relative.strip("/").split("/")
    if len(parts) < 3 or not parts[-2].isdigit():
        return None
    match = _FILE_NAME.match(parts[-1])
    if match is None:
        return None
    return parts[-3], int(parts[-2]), int(match["first"])


def _committed_file(origin: tuple[str, int, int], committed: dict[TP, int]) -> bool:
    topic, partition, first = origin
    return first < committed.get((topic, partition), -1)


def directory_files(root: Path, topics: Iterable[str], committed: dict[TP, int]) -> TargetRows:
    found = TargetRows(described=f"dir {root}")
    for topic in topics:
        base = root / topic
        for path in sorted(base.glob("*/*.parquet")) if base.is_dir() else []:
            origin = _layout_file(str(path.relative_to(root)))
            if origin is None:  # temporary files start with a dot and do not match
                continue
            if not _committed_file(origin, committed):
                found.uncommitted_files += 1
                continue
            found.files.append(TargetFile(path, *origin, where=str(path)))
    return found


def s3_files(config: SinkConfig, topics: Iterable[str], committed: dict[TP, int], download_dir: Path) -> TargetRows:
    from uploader.s3 import s3_client

    settings = s3_settings(config, config.s3_bucket or "", config.s3_prefix or "", RetryPolicy())
    client = s3_client(settings)
    prefix = settings.prefix.strip("/")
    found = TargetRows(described=f"s3 {settings.uri(prefix)}")
    download_dir.mkdir(parents=True, exist_ok=True)
    for topic in topics:
        listing = f"{prefix}/{topic}/" if prefix else f"{topic}/"
        for key in _keys(client, settings.bucket, listing):
            origin = _layout_file(key[len(prefix):] if prefix else key)
            if origin is None:
                continue
            if not _committed_file(origin, committed):
                found.uncommitted_files += 1
                continue
            local = download_dir / f"{len(found.files):08d}.parquet"
            client.download_file(settings.bucket, key, str(local))
            found.files.append(TargetFile(local, *origin, where=settings.uri(key)))
    return found


def _keys(client: object, bucket: str, prefix: str) -> Iterator[str]:
    paginator = client.get_paginator("list_objects_v2")  # type: ignore[attr-defined]
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            yield item["Key"]


def export_files(path: Path) -> TargetRows:
    """Parquet files given by the operator (a file or a directory of them): an EMS table's export."""
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet") if not p.name.startswith("."))
    else:
        raise TargetUnreadable(f"--target-export {path}: no such file or directory")
    if not files:
        raise TargetUnreadable(f"--target-export {path}: no .parquet files in it")
    rows = TargetRows(described=f"export {path}")
    for n, file in enumerate(files):
        origin = _layout_file(str(file.relative_to(path))) if path.is_dir() else None
        rows.files.append(TargetFile(file, *(origin or ("", -1, n)), where=str(file)))
    return rows


def local_ems_root(endpoint: str) -> str | None:
    """The root URL of a `local_ems` at a loopback `endpoint`, or None for any other host."""
    parts = urlsplit(endpoint)
    try:
        if not ipaddress.ip_address(parts.hostname or "").is_loopback:
            return None
    except ValueError:
        if parts.hostname != "localhost":
            return None
    return f"{parts.scheme}://{parts.netloc}"


def ems_table(config: SinkConfig, table: str, download_dir: Path) -> TargetRows:
    """A `local_ems` table as one Parquet file; `TargetUnreadable` for the real EMS."""
    root = local_ems_root(config.ems_endpoint or "")
    if root is None:
        raise TargetUnreadable(NO_READ_BACK)
    url = f"{root}/_control/tables/{quote(table, safe='')}"
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # local_ems: no upload has created the table
            return _ems_rows(table, [], [], download_dir, url)
        raise TargetUnreadable(f"{NO_READ_BACK} ({url} answered HTTP {exc.code})") from None
    except (OSError, ValueError) as exc:
        raise TargetUnreadable(f"{NO_READ_BACK} ({url}: {exc})") from None
    return _ems_rows(table, answer["columns"], answer["rows"], download_dir, url)


def delta_table(config: SinkConfig, uri: str, download_dir: Path, topic: str,
                primary_keys: Sequence[str] = ()) -> TargetRows:
    """A Delta table's current rows as one local Parquet file, written batch by batch (bounded memory). In
    change-log mode, what a reader sees: the keyed table with the change log applied (uploader.delta_view)."""
    from deltalake.exceptions import DeltaError

    from sink_service.config.upload_targets import target_settings
    from uploader.delta_settings import DeltaSettings
    from uploader.delta_view import current_batches

    settings = target_settings(config)
    settings = getattr(settings, "inner", settings)  # rejected files parked: the table is the inner target
    if not isinstance(settings, DeltaSettings):
        raise TargetUnreadable(f"SINK_TARGET={config.target} is not a Delta table")
    what = f"Delta table {uri}" + (f" and its change log {settings.changes_uri_for(topic)}" if settings.change_log
                                   else "")
    try:
        found = current_batches(settings, topic, primary_keys, config.order_field)
        if found is None:
            return TargetRows(described=f"{what} (not created yet: no file was merged)")
        download_dir.mkdir(parents=True, exist_ok=True)
        path = download_dir / "delta.parquet"
        schema, batches = found
        with pq.ParquetWriter(path, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
    except (DeltaError, OSError) as exc:
        raise TargetUnreadable(f"{what} cannot be read: {exc}") from None
    return TargetRows(files=[TargetFile(path, where=what)], described=what)


def _ems_rows(table: str, columns: list[str], rows: list[list], download_dir: Path, url: str) -> TargetRows:
    download_dir.mkdir(parents=True, exist_ok=True)
    found = TargetRows(described=f"local_ems table {table!r} ({url})")
    if not columns:
        return found
    arrays = {}
    for n, name in enumerate(columns):
        values = [row[n] for row in rows]
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # SQLite lets one column hold several types
            arrays[name] = pa.array([None if v is None else str(v) for v in values], pa.string())
    path = download_dir / f"ems-{len(found.files)}.parquet"
    pq.write_table(pa.table(arrays), path)
    found.files.append(TargetFile(path, where=f"local_ems table {table}"))
    return found
