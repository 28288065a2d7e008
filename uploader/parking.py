"""Parking: a file the endpoint rejects as bad content is set aside instead of stopping the service.

Wraps any target. A FatalUploadError whose reason says "this file's content is refused" parks the
file under SINK_PARKED_PATH, a directory or an S3 location, at the same deterministic path as the
dir and S3 targets (`<topic>/<partition>/<first>-<last>.parquet`), with `<same>.response.json`
beside it holding the endpoint's answer and the file's metadata; both are written atomically (a
file renamed into place and its directory fsynced, or one S3 request each). Every other fatal error
still stops the service, whatever its status: EMS's 401/403/404, and S3's 400s for an expired or
invalid session token, a request signed for the wrong region or an argument the store does not
take, are configuration, and parking them would set aside every file and commit its offsets. A
parking write that fails is retryable: the range is replayed, never skipped.
`python -m uploader push <parked file>` re-pushes it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pathlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from uploader.directory import DirectorySettings, DirectoryTarget, write_atomically
from uploader.errors import FatalUploadError, RetryableUploadError, UploadError
from uploader.retry import OnRetry
from uploader.s3_settings import S3Settings
from uploader.target import FileMetadata, Receipt, UploadTarget

if TYPE_CHECKING:
    from uploader.s3 import S3Target

PARKED_TARGET = "parked"
SIDECAR_SUFFIX = ".response.json"
# What a rejection of one file's *content* looks like, per target name, as the error's reason. The
# status alone never decides: S3 answers 400 to ExpiredToken, InvalidToken, InvalidArgument and
# AuthorizationHeaderMalformed too. A target that is not listed never parks.
CONTENT_REJECTIONS: Mapping[str, frozenset[str]] = {
    # EMS: the file does not fit the table (400), or is larger than EMS takes (413).
    "ems": frozenset({"http_400", "http_413"}),
    # S3 does not read the file; only its size can be refused (or a 413 from a proxy in front).
    "s3": frozenset({"s3_EntityTooLarge", "http_413"}),
    # Delta: a column type the table cannot take (uploader.delta, a narrowing), or a key column missing.
    "delta": frozenset({"delta_schema"}),
}


def is_content_rejection(target_name: str, error: FatalUploadError) -> bool:
    """True when `error` refuses this file's content, so parking it is right and its offsets may be committed."""
    return error.reason in CONTENT_REJECTIONS.get(target_name, frozenset())


@dataclass(frozen=True)
class ParkingSettings:
    """The real target's settings plus where rejected files go; hashable and picklable."""

    inner: Any  # the wrapped target's settings
    parked: DirectorySettings | S3Settings


def sidecar_path(parked_file: pathlib.Path) -> pathlib.Path:
    return parked_file.with_name(parked_file.name + SIDECAR_SUFFIX)


def read_sidecar_metadata(parked_file: pathlib.Path) -> FileMetadata | None:
    """The metadata saved beside a parked file, or None when there is no sidecar."""
    sidecar = sidecar_path(parked_file)
    if not sidecar.exists():
        return None
    fields = json.loads(sidecar.read_text())["metadata"]
    fields["primary_keys"] = tuple(fields["primary_keys"])
    return FileMetadata(**fields)


class ParkingTarget:
    """UploadTarget that parks content rejections of the wrapped target; see the module docstring."""

    def __init__(self, inner: UploadTarget, parked: DirectorySettings | S3Settings) -> None:
        self.inner = inner
        self.name = inner.name
        self.parked: DirectoryTarget | S3Target
        if isinstance(parked, S3Settings):
            from uploader.s3 import S3Target  # boto3 only where files are parked in S3

            self.parked = S3Target(parked)
        else:
            self.parked = DirectoryTarget(parked)

    def upload(self, path: pathlib.Path, metadata: FileMetadata, on_retry: OnRetry | None = None) -> Receipt:
        started = time.monotonic()
        try:
            return self.inner.upload(path, metadata, on_retry=on_retry)
        except FatalUploadError as exc:
            if not is_content_rejection(self.inner.name, exc):
                raise
            return self.park(path, metadata, exc, started)

    def park(self, path: pathlib.Path, metadata: FileMetadata, rejection: FatalUploadError,
             started: float | None = None) -> Receipt:
        """Set the file aside with the rejection beside it; also used by the driver for the Delta files it
        merges (sink_service.driver.delta_batches)."""
        started = time.monotonic() if started is None else started
        try:
            stored = self.parked.upload(path, metadata)
            self._store_sidecar(stored, {
                "status": rejection.status,
                "reason": rejection.reason,
                "body": rejection.body,
                "error": str(rejection),
                "metadata": dataclasses.asdict(metadata),
            })
        except (UploadError, OSError) as exc:
            raise RetryableUploadError(
                f"parking {metadata.file_name()} (rejected with HTTP {rejection.status}) under "
                f"SINK_PARKED_PATH failed: {exc}", reason="park") from exc
        return Receipt(
            target=PARKED_TARGET, location=stored.location, response_id=None, bytes=stored.bytes,
            attempts=1, duration_s=time.monotonic() - started,
            details={"status": rejection.status, "reason": rejection.reason})

    def _store_sidecar(self, stored: Receipt, document: dict[str, Any]) -> None:
        if isinstance(self.parked, DirectoryTarget):
            _write_atomically(sidecar_path(pathlib.Path(stored.location)), document)
        else:
            body = json.dumps(document, indent=2, ensure_ascii=False).encode()
            self.parked.put_object(stored.details["key"] + SIDECAR_SUFFIX, body, "application/json")

    def close(self) -> None:
        self.inner.close()
        self.parked.close()


def _write_atomically(final: pathlib.Path, document: dict[str, Any]) -> None:
    """The directory target's atomic write (temporary file, fsync, rename, fsync of the directory):
    readers see all of it or nothing, and the sidecar's name survives a power loss after the commit."""
    body = json.dumps(document, indent=2, ensure_ascii=False).encode()
    write_atomically(io.BytesIO(body), final)
