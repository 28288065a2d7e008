"""Directory target: each file lands at `<root>/<topic>/<partition>/<first:020d>-<last:020d>.parquet`.

The relative path is FileMetadata.object_key(), the same as the S3 key, so a replay overwrites the
same file. Writes are atomic: the bytes go to a temporary file in the destination directory
(`.<final name>.tmp-<uuid>`), which is fsynced and then renamed over the final name, and the
directory is fsynced so the rename survives a power loss. A crash at any moment leaves either the
old file, the new file, or a stray temporary file that readers ignore -- never a partial file under
a final name. Stray temporary files are not removed automatically (another writer may still own
one); anything matching `.*.tmp-*` older than a day is safe to delete.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Self

from uploader.errors import FatalUploadError, RetryableUploadError, UploadError
from uploader.retry import OnRetry, RetryPolicy, call_with_retries
from uploader.target import FileMetadata, Receipt

PATH_SETTING = "SINK_DIR_PATH"
TEMP_MARKER = ".tmp-"
COPY_CHUNK = 1 << 20

# A person must fix these (permissions, a read-only mount, a file where a directory should be).
_FATAL_ERRNOS = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOTDIR: "a path component is not a directory",
    errno.EISDIR: "a directory is in the way of the file",
    errno.ENAMETOOLONG: "the path is too long",
    errno.ELOOP: "too many symbolic links",
}
# Space can be freed; other I/O errors (EIO, ESTALE on NFS, timeouts) are treated as transient too.
_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class DirectorySettings:
    """Frozen, hashable and picklable, like the other targets' settings."""

    path: str
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not str(self.path).strip():
            raise ValueError(f"{PATH_SETTING} must name a directory")


def temp_name(final_name: str) -> str:
    """Hidden and recognisable, in the destination directory so the rename stays on one file system."""
    return f".{final_name}{TEMP_MARKER}{uuid.uuid4().hex}"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TEMP_MARKER in name


class DirectoryTarget:
    """UploadTarget that writes into a local or mounted directory."""

    name = "dir"

    def __init__(self, settings: DirectorySettings) -> None:
        self.settings = settings
        self.root = pathlib.Path(settings.path)

    def final_path(self, metadata: FileMetadata) -> pathlib.Path:
        return self.root / metadata.object_key()

    def upload(self, path: pathlib.Path, metadata: FileMetadata, on_retry: OnRetry | None = None) -> Receipt:
        path = pathlib.Path(path)
        size = path.stat().st_size
        final = self.final_path(metadata)
        what = f"write of {metadata.file_name()} ({size} bytes) to {final}"
        started = time.monotonic()
        _, attempts = call_with_retries(lambda attempt: self._write(path, final, what), self.settings.retry, on_retry)
        return Receipt(
            target=self.name,
            location=str(final),
            response_id=None,
            bytes=size,
            attempts=attempts,
            duration_s=time.monotonic() - started,
            details={"path": str(final)},
        )

    def describe_request(self, path: pathlib.Path, metadata: FileMetadata) -> dict[str, Any]:
        """What upload() would do; for a --dry-run that writes nothing."""
        path = pathlib.Path(path)
        final = self.final_path(metadata)
        return {
            "method": "atomic write (temporary file, fsync, rename, fsync directory)",
            "final_path": str(final),
            "temp_path": str(final.parent / f".{final.name}{TEMP_MARKER}<uuid>"),
            "file_path": str(path),
            "file_size": path.stat().st_size,
            "retry": {"max_elapsed_s": self.settings.retry.max_elapsed_s},
        }

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write(self, source: pathlib.Path, final: pathlib.Path, what: str) -> None:
        with open(source, "rb") as src:  # a missing source is the caller's bug, not an upload error
            try:
                _make_dirs(final.parent)
                write_atomically(src, final)
            except OSError as exc:
                raise classify_os_error(exc, what=what) from exc


def write_atomically(src: BinaryIO, final: pathlib.Path) -> None:
    """Copy `src` to `final` so that `final` is either absent/old or complete, never partial."""
    temp = final.parent / temp_name(final.name)
    try:
        with open(temp, "xb") as out:
            _copy(src, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    _fsync_dir(final.parent)


def _copy(src: BinaryIO, out: BinaryIO) -> None:
    shutil.copyfileobj(src, out, COPY_CHUNK)


def _make_dirs(directory: pathlib.Path) -> None:
    """mkdir -p, fsyncing each parent whose entries changed so the new directories are durable."""
    missing = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for created in reversed(missing):
        try:
            created.mkdir()
        except FileExistsError:
            continue  # another writer made it
        _fsync_dir(created.parent)


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def classify_os_error(exc: OSError, *, what: str) -> UploadError:
    """Permissions and read-only mounts need a person; a full disk or flaky I/O may pass."""
    name = errno.errorcode.get(exc.errno or 0, "OSError")
    detail = f"{name}: {exc.strerror or exc}"
    if exc.filename:
        detail += f" ({exc.filename})"
    if exc.errno in _FATAL_ERRNOS:
        return FatalUploadError(
            f"{what} failed: {_FATAL_ERRNOS[exc.errno]} ({detail}); this will not be retried. Check "
            f"{PATH_SETTING}: it must be a directory this process may write to.",
            reason=f"fs_{name.lower()}",
            setting=PATH_SETTING,
        )
    if exc.errno in _NO_SPACE_ERRNOS:
        return RetryableUploadError(f"{what} failed: no space left ({detail})", reason="disk_full")
    return RetryableUploadError(f"{what} failed: {detail}", reason="io")
