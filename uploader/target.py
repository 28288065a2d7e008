"""The one interface every upload target implements, and the data that crosses it."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from uploader.retry import OnRetry


@dataclass(frozen=True)
class FileMetadata:
    """Everything a target needs besides the bytes; also names the file deterministically."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    record_count: int
    target_table: str  # EMS targetName
    primary_keys: tuple[str, ...]  # may be empty
    order_column: str | None  # only meaningful together with primary keys
    schema_fingerprint: str  # short hex digest of the Arrow schema

    def file_name(self) -> str:
        """Informative name so a file found in the endpoint's bucket leads back to its offsets."""
        return (
            f"topic-{self.topic}_partition-{self.partition}"
            f"_firstOffset-{self.first_offset}_lastOffset-{self.last_offset}.parquet"
        )

    def object_key(self, prefix: str = "") -> str:
        """Deterministic, sortable key so a replay of the same range overwrites the same object."""
        key = f"{self.topic}/{self.partition}/{self.first_offset:020d}-{self.last_offset:020d}.parquet"
        prefix = prefix.strip("/")
        return f"{prefix}/{key}" if prefix else key


@dataclass(frozen=True)
class Receipt:
    """Proof of a successful upload; only after one may the caller commit the file's offsets."""

    target: str  # "ems", "s3", "dir"
    location: str  # EMS response id / s3 uri / file path
    response_id: str | None
    bytes: int
    attempts: int
    duration_s: float
    # The endpoint's full answer (EMS: fileName, bucketId, flushStatus, ...), for logs and the CLI.
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@runtime_checkable
class UploadTarget(Protocol):
    """Narrow on purpose: the service only ever needs "push this file" and "release resources"."""

    name: str

    def upload(self, path: pathlib.Path, metadata: FileMetadata, on_retry: OnRetry | None = None) -> Receipt:
        """Push one closed file; raise FatalUploadError or RetryableUploadError on failure."""
        ...

    def close(self) -> None:
        """Release connections; the target is not used afterwards."""
        ...
