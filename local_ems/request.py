"""An HTTP request as the endpoint logic sees it; the body is read only when a handler asks for it."""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message
from typing import Protocol


class Body(Protocol):
    def read(self, limit: int) -> bytes:
        """The whole body; HttpError(413) when it is larger than `limit` bytes."""
        ...


@dataclass(frozen=True)
class Request:
    method: str
    segments: tuple[str, ...]  # percent-decoded path segments
    query: dict[str, list[str]]
    headers: Message
    client_host: str
    body: Body

    def first(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None
