"""A multipart/form-data body with one file part, read from disk as it is sent.

requests' `files=` builds the whole body in memory; this streams the file in chunks and still
sends a Content-Length (some gateways reject chunked uploads), so memory stays flat per upload.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator
from typing import BinaryIO, Self

CHUNK_SIZE = 1 << 16


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
        self._head = (
            f"--{self.boundary}\r\n"
            f'Content-Disposition: form-data; name="{_quote(field_name)}"; '
            f'filename="{_quote(file_name)}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        ).encode()
        self._tail = f"\r\n--{self.boundary}--\r\n".encode()
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
