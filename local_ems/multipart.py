"""A small multipart/form-data parser (RFC 7578) over an in-memory body.

The `cgi` module is gone from Python 3.13, and the email parser copies and decodes whole bodies; this
only searches for boundaries with `bytes.find` and hands parts out as zero-copy memoryviews, so a
100 MB Parquet part costs one scan. Header blocks are still parsed by the email package.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from email.policy import HTTP
from email.utils import collapse_rfc2231_value

from local_ems.responses import HttpError


@dataclass(frozen=True)
class Part:
    name: str | None
    filename: str | None
    content_type: str | None
    data: memoryview


def boundary_of(content_type: str | None) -> bytes:
    """The boundary from a `multipart/form-data; boundary=...` header, or a 400 saying what is wrong."""
    if not content_type:
        raise HttpError(400, "Content-Type header is missing; expected multipart/form-data with a `file` part")
    message = Message()
    message["Content-Type"] = content_type
    if message.get_content_type() != "multipart/form-data":
        raise HttpError(400, f"Content-Type must be multipart/form-data, got {message.get_content_type()!r}")
    boundary = message.get_param("boundary")
    if not isinstance(boundary, str) or not 1 <= len(boundary) <= 200:
        raise HttpError(400, "Content-Type multipart/form-data has no usable boundary parameter")
    return boundary.encode("latin-1")


def parse_form_data(body: bytes, content_type: str | None) -> list[Part]:
    """All parts of a form-data body; raises HttpError(400) on a malformed or truncated body."""
    delimiter = b"--" + boundary_of(content_type)
    view = memoryview(body)
    if body.startswith(delimiter):
        position = len(delimiter)
    else:  # a preamble is allowed before the first delimiter line
        found = body.find(b"\r\n" + delimiter)
        if found < 0:
            raise HttpError(400, "multipart body does not contain the boundary from the Content-Type header")
        position = found + 2 + len(delimiter)
    parts: list[Part] = []
    while True:
        if body.startswith(b"--", position):
            return parts  # closing delimiter; an epilogue may follow and is ignored
        line_end = body.find(b"\r\n", position)
        if line_end < 0 or body[position:line_end].strip(b" \t"):
            raise HttpError(400, "multipart body is malformed: a boundary line is not followed by CRLF")
        headers_start = line_end + 2
        headers_end = body.find(b"\r\n\r\n", headers_start - 2)
        if headers_end < 0:
            raise HttpError(400, "multipart body is truncated inside the headers of a part")
        data_start = headers_end + 4
        data_end = body.find(b"\r\n" + delimiter, data_start)
        if data_end < 0:
            raise HttpError(400, "multipart body is truncated: the closing boundary is missing")
        headers = _parse_headers(body[headers_start:headers_end])
        parts.append(Part(
            name=_param(headers, "name"),
            filename=headers.get_filename(),
            content_type=headers.get("content-type"),
            data=view[data_start:data_end],
        ))
        position = data_end + 2 + len(delimiter)


def single_file_part(parts: list[Part], field: str = "file") -> Part:
    """The one part named `field`; EMS expects exactly one."""
    matches = [part for part in parts if part.name == field]
    if len(matches) != 1:
        names = [part.name for part in parts]
        raise HttpError(400, f"multipart body must have exactly one part named `{field}`; found parts {names}")
    return matches[0]


def _param(headers: Message, name: str) -> str | None:
    value = headers.get_param(name, header="content-disposition")
    if isinstance(value, tuple):  # RFC 2231 encoded: (charset, language, value)
        value = collapse_rfc2231_value(value)
    return value or None


def _parse_headers(block: bytes) -> Message:
    # Clients put raw UTF-8 file names in the quoted filename; decode as UTF-8, not as ASCII.
    message = Parser(policy=HTTP).parsestr(block.decode("utf-8", "replace") + "\r\n\r\n", headersonly=True)
    if message.get_content_disposition() != "form-data":
        raise HttpError(400, "every multipart part needs `Content-Disposition: form-data; name=...`")
    return message
