"""What can be learned about a Parquet file without the service: its name, its footer, its schema.

Used by the CLI to re-push a file by hand with the same metadata the service would have sent.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

# FileMetadata.file_name(): topic-<t>_partition-<p>_firstOffset-<f>_lastOffset-<l>.parquet.
# Topic names may contain "_", so the topic is whatever precedes the last "_partition-<digits>".
_FILE_NAME = re.compile(
    r"topic-(?P<topic>.+)_partition-(?P<partition>\d+)"
    r"_firstOffset-(?P<first_offset>\d+)_lastOffset-(?P<last_offset>\d+)\.parquet"
)


@dataclass(frozen=True)
class RangeName:
    topic: str
    partition: int
    first_offset: int
    last_offset: int


def parse_file_name(name: str) -> RangeName | None:
    """Topic, partition and offsets from a service file name; None when the name has another shape."""
    match = _FILE_NAME.fullmatch(pathlib.PurePath(name).name)
    if match is None:
        return None
    return RangeName(
        topic=match["topic"],
        partition=int(match["partition"]),
        first_offset=int(match["first_offset"]),
        last_offset=int(match["last_offset"]),
    )


# Parquet schema metadata: comma-separated columns a file carries only for its target's bookkeeping
# (a Delta target cuts a replay's overlap by `_offset`), which the target drops before its table.
BOOKKEEPING_KEY = b"kafka_parquet_sink.bookkeeping"


# Parquet key-value metadata of a file for a typed table: the Arrow bytes of each row group, comma-separated,
# so a merge can cut a large file into pieces that fit its memory bound without reading it first.
ROW_GROUP_BYTES_KEY = b"kafka_parquet_sink.row_group_arrow_bytes"


def bookkeeping_columns(schema: pa.Schema) -> tuple[str, ...]:
    """The columns `schema` names as bookkeeping (written by the service's writer)."""
    value = (schema.metadata or {}).get(BOOKKEEPING_KEY, b"")
    return tuple(c for c in value.decode().split(",") if c)


def schema_fingerprint(schema: pa.Schema) -> str:
    """Short digest of column names and Arrow types; equal schemas give equal fingerprints.

    The service uses this same function, so a file pushed by hand carries the fingerprint the
    service would have sent.
    """
    text = ",".join(f"{f.name}:{f.type}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FooterInfo:
    record_count: int
    schema_fingerprint: str
    schema: pa.Schema


def footer_info(path: pathlib.Path) -> FooterInfo:
    """Record count and schema from the footer only; the data pages are not read."""
    with pq.ParquetFile(path) as parquet:
        schema = parquet.schema_arrow
        return FooterInfo(parquet.metadata.num_rows, schema_fingerprint(schema), schema)
