"""A multipart/form-data body with one file part.

requests' `files=` builds the whole body through its field encoder; `MultipartFileBody` streams the
file in chunks and still sends a Content-Length (some gateways reject chunked uploads), so memory
stays flat per upload. A file of at most `IN_MEMORY_MAX_BYTES` is sent as one bytes object instead
(`multipart_bytes`, the same wire format): one read and one join, where streaming paid a read per
16 KiB block and urllib3's generator, a measurable share of the per-file cost when many partitions
each cut small files.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator
from typing import BinaryIO, Self

CHUNK_SIZE = 1 << 16
# Files up to this size are sent from memory (`multipart_bytes`): a live run's files are tens of KB.
IN_MEMORY_MAX_BYTES = 1 << 20


def _head_and_tail(boundary: str, field_name: str, file_name: str, content_type: str) -> tuple[bytes, bytes]:
    head = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="{_quote(field_name)}"; '
        f'filename="{_quote(file_name)}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    return head, f"\r\n--{boundary}--\r\n".encode()


def multipart_bytes(
    path: pathlib.Path, *, field_name: str, file_name: str, content_type: str = "application/octet-stream"
) -> tuple[bytes, str]:
    """The whole body for a small file, and its Content-Type: the bytes `MultipartFileBody` would stream."""
    boundary = uuid.uuid4().hex
    head, tail = _head_and_tail(boundary, field_name, file_name, content_type)
    with open(path, "rb") as file:
        return b"".join((head, file.read(), tail)), f"multipart/form-data; boundary={boundary}"


class MultipartFileBody:
    """File-like body for requests: `read()`, `len()`, and a `content_type` carrying the boundary.

    One instance serves one request; build a new one for each attempt.
    """

    def __init__(
        self,
        path: pathlib.Path,
        *,
        field_name: str,
        file_name: str,
        content_type: str = "application/octet-stream",
    ) -> None:
        self.boundary = uuid.uuid4().hex
        self.content_type = f"multipart/form-data; boundary={self.boundary}"
        self._file: BinaryIO = open(path, "rb")  # noqa: SIM115 -- closed by close()
        self._file_left = os.fstat(self._file.fileno()).st_size
        self._head, self._tail = _head_and_tail(self.boundary, field_name, file_name, content_type)
        self._length = len(self._head) + self._file_left + len(self._tail)

    def __len__(self) -> int:
        return self._length

    def read(self, size: int = -1) -> bytes:
        """Serve head, then file bytes, then tail; never more file bytes than the announced length."""
        if size is None or size < 0:
            size = self._length
        out = bytearray()
        while len(out) < size:
            if self._head:
                take, self._head = self._head[: size - len(out)], self._head[size - len(out) :]
            elif self._file_left:
                take = self._file.read(min(size - len(out), self._file_left))
                if not take:
                    raise OSError(f"{self._file.name} shrank while it was being uploaded")
                self._file_left -= len(take)
            elif self._tail:
                take, self._tail = self._tail[: size - len(out)], self._tail[size - len(out) :]
            else:
                break
            out += take
        return bytes(out)

    def __iter__(self) -> Iterator[bytes]:
        # requests treats objects with __iter__ as streams; urllib3 then prefers read().
        while chunk := self.read(CHUNK_SIZE):
            yield chunk

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _quote(value: str) -> str:
    # The WHATWG form-data convention: percent-escape what would break the quoted header value.
    return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
