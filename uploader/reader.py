"""Read back what a directory or S3 target holds, and reduce it to the latest row per primary key.

This is what an upsert endpoint does with the files (keep, per key, the row with the highest order
value), done locally with Arrow: one sort and one ordered group-by, no per-row Python. Useful to
check a dir/S3 sink by hand (`python -m uploader read`) and in tests.

Files are visited in key order (topic, partition, first offset), so among rows with the same order
value the one from the later file, and within a file the later row, wins. Temporary files of an
interrupted directory write (`.<name>.tmp-<id>`) and other hidden files are skipped.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from uploader.directory import DirectorySettings
from uploader.s3 import s3_client
from uploader.s3_settings import S3Settings

Source = DirectorySettings | S3Settings | str | os.PathLike
PARQUET_SUFFIX = ".parquet"
_ROW = "__uploader_row"


def resolve(source: Source) -> DirectorySettings | S3Settings:
    """Settings for a location: settings pass through, `s3://bucket/prefix` and paths are parsed."""
    if isinstance(source, DirectorySettings | S3Settings):
        return source
    text = os.fspath(source)
    if text.startswith("s3://"):
        parts = urlsplit(text)
        return S3Settings(bucket=parts.netloc, prefix=parts.path.strip("/"))
    return DirectorySettings(path=text)


def _visible(name: str) -> bool:
    return name.endswith(PARQUET_SUFFIX) and not name.startswith(".")


def parquet_files(source: Source) -> list[str]:
    """Every Parquet file the target holds, in key order: file paths, or s3:// URIs."""
    settings = resolve(source)
    if isinstance(settings, DirectorySettings):
        root = pathlib.Path(settings.path)
        if not root.is_dir():
            raise FileNotFoundError(f"no such directory: {root}")
        found = (p for p in root.rglob(f"*{PARQUET_SUFFIX}") if p.is_file() and _visible(p.name))
        return sorted(str(p) for p in found)
    client = s3_client(settings)
    try:
        return [settings.uri(key) for key in _s3_keys(settings, client)]
    finally:
        client.close()


def read_all(source: Source) -> pa.Table:
    """All rows of all files, in key order; differing schemas are unified (new columns, widened types)."""
    settings = resolve(source)
    if isinstance(settings, DirectorySettings):
        tables = [pq.read_table(path) for path in parquet_files(settings)]
    else:
        client = s3_client(settings)
        try:
            tables = [_read_s3_object(client, settings.bucket, key) for key in _s3_keys(settings, client)]
        finally:
            client.close()
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")


def latest_rows(source: Source, primary_keys: Sequence[str], order_column: str | None = "_offset") -> pa.Table:
    """The latest row per primary key over every file the target holds, sorted by the keys."""
    return latest_per_key(read_all(source), primary_keys, order_column)


def latest_per_key(table: pa.Table, primary_keys: Sequence[str], order_column: str | None) -> pa.Table:
    """Per key, the row with the highest `order_column` (nulls lose; ties go to the later row).

    Without primary keys every row is kept, as an upsert endpoint would. `order_column=None` keeps
    the last row of each key.
    """
    primary_keys = list(primary_keys)
    if not primary_keys or table.num_rows == 0:
        return table
    needed = [*primary_keys, *([order_column] if order_column else [])]
    missing = [name for name in needed if name not in table.column_names]
    if missing:
        raise ValueError(f"column(s) {', '.join(missing)} not found; the files have: {', '.join(table.column_names)}")
    indexed = table.select(needed).append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    sort_keys = [(order_column, "descending")] if order_column else []
    ordered = indexed.sort_by([*sort_keys, (_ROW, "descending")])  # nulls are placed last: they lose
    # use_threads=False keeps input order within each group, so "first" is the winner.
    winners = ordered.group_by(primary_keys, use_threads=False).aggregate([(_ROW, "first")])
    latest = table.take(winners.column(f"{_ROW}_first"))
    return latest.sort_by([(key, "ascending") for key in primary_keys])


def _s3_keys(settings: S3Settings, client) -> list[str]:
    prefix = settings.prefix.strip("/")
    paginator = client.get_paginator("list_objects_v2")
    keys = []
    for page in paginator.paginate(Bucket=settings.bucket, Prefix=f"{prefix}/" if prefix else ""):
        keys += [item["Key"] for item in page.get("Contents", []) if _visible(item["Key"].rpartition("/")[2])]
    return sorted(keys)


def _read_s3_object(client, bucket: str, key: str) -> pa.Table:
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        return pq.read_table(pa.BufferReader(body.read()))
    finally:
        body.close()
