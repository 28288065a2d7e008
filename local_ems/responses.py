"""HTTP responses as plain values, so endpoint logic stays independent of http.server."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    note: str = ""  # extra words for the one-line request log, e.g. "rows=100"


class HttpError(Exception):
    """A client error with a message the caller can act on; sent as a plain-text body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def text(status: int, message: str, **headers: str) -> Response:
    return Response(status, (message.rstrip("\n") + "\n").encode(), headers=dict(headers))


def as_json(status: int, value: Any, **headers: str) -> Response:
    body = json.dumps(value, default=_json_default, ensure_ascii=False).encode()
    return Response(status, body, "application/json", dict(headers))


def server_error(message: str, status: int = 500, **headers: str) -> tuple[Response, str]:
    """EMS answers 5xx with `{reference, message}`; the reference ties the response to our log."""
    reference = str(uuid.uuid4())
    return as_json(status, {"reference": reference, "message": message}, **headers), reference


def _json_default(value: Any) -> Any:
    """BLOB cells travel as base64 text; JSON has no bytes."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
