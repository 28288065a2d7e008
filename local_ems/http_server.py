"""The HTTP layer: http.server plumbing around the Router, with keep-alive, body limits and logging.

Bodies are read only when a handler asks (so a 401 or 413 is decided before the upload is read),
and whatever a handler left unread is drained afterwards, up to a limit, so the client sees the
answer instead of a reset connection. The request log never contains header values.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from local_ems.request import Request
from local_ems.responses import HttpError, Response, server_error, text
from local_ems.routes import Router

log = logging.getLogger("local_ems.http")

DRAIN_LIMIT = 64 << 20  # unread bodies up to this size are drained; larger ones close the connection
_CHUNK = 1 << 20


class _ClientGone(Exception):
    """The client stopped sending mid-body; there is nobody to answer."""


class EmsHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, host: str, port: int, router: Router, redact: Callable[[str], str]) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.router = router
        self.redact = redact
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__((host, port), EmsRequestHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls getfqdn(), a reverse DNS lookup that can stall for seconds.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        # The handler writes a response's headers and its body apart: with Nagle's algorithm the body waits for the
        # client's delayed ACK of the headers, ~40 ms on every request (an upload of 1,000 rows: 52 ms median,
        # 7.7 ms with TCP_NODELAY).
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)  # type: ignore[arg-type]

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: object, client_address: object) -> None:  # type: ignore[override]
        """One line instead of socketserver's traceback on stderr, e.g. for a client that hung up."""
        error = sys.exc_info()[1]
        log.warning("connection from %s ended: %s: %s", client_address, type(error).__name__, error)

    def close_connections(self) -> None:
        """End idle keep-alive connections, so no handler thread outlives stop()."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Body:
    """Reads a request body once: Content-Length or chunked; refuses more than the caller's limit."""

    def __init__(self, handler: EmsRequestHandler) -> None:
        self._handler = handler
        self.done = False  # nothing left to read on the socket
        self.unreadable = False  # the connection cannot be reused

    def read(self, limit: int) -> bytes:
        if self.done:
            raise HttpError(500, "request body was read twice")
        if "chunked" in self._handler.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(limit)
        length = self.length()
        if length > limit:
            raise HttpError(413, f"request body of {length} bytes is larger than the limit of {limit} bytes")
        data = self._read_exactly(length)
        self.done = True
        return data

    def length(self) -> int:
        value = self._handler.headers.get("Content-Length")
        if value is None:
            return 0
        try:
            length = int(value)
        except ValueError:
            length = -1
        if length < 0:
            self.unreadable = True
            raise HttpError(400, f"invalid Content-Length {value!r}")
        return length

    def drain(self) -> None:
        """Discard what is left so the connection can serve the next request, or mark it for closing."""
        if self.done or self.unreadable:
            return
        if "chunked" in self._handler.headers.get("Transfer-Encoding", "").lower():
            self.unreadable = True
            return
        left = self.length()
        if left > DRAIN_LIMIT:
            self.unreadable = True
            return
        while left > 0:
            chunk = self._handler.rfile.read(min(left, _CHUNK))
            if not chunk:
                self.unreadable = True
                return
            left -= len(chunk)
        self.done = True

    def _read_exactly(self, length: int) -> bytes:
        data = self._handler.rfile.read(length)
        if len(data) != length:
            self.unreadable = True
            raise _ClientGone(f"body ended after {len(data)} of {length} bytes")
        return data

    def _read_chunked(self, limit: int) -> bytes:
        data = bytearray()
        rfile = self._handler.rfile
        while True:
            line = rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.unreadable = True
                raise HttpError(400, "malformed chunked request body") from None
            if size == 0:
                while rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                self.done = True
                return bytes(data)
            if len(data) + size > limit:
                self.unreadable = True
                raise HttpError(413, f"request body is larger than the limit of {limit} bytes")
            data += self._read_exactly(size)
            rfile.readline(8)  # CRLF after the chunk


class EmsRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as requests.Session and urllib3 pools expect
    server_version = "local-ems/1"
    timeout = 300  # seconds a connection may sit idle or stall mid-body
    server: EmsHttpServer

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def _serve(self) -> None:
        started = time.perf_counter()
        split = urlsplit(self.path)
        body = _Body(self)
        request = Request(
            method=self.command,
            segments=tuple(unquote(s) for s in split.path.split("/") if s),
            query=parse_qs(split.query, keep_blank_values=True),
            headers=self.headers,
            client_host=str(self.client_address[0]),
            body=body,
        )
        try:
            response = self.server.router.handle(request)
        except HttpError as error:
            response = text(error.status, error.message)
        except _ClientGone as gone:
            self.close_connection = True
            self._log(started, 499, f"client gone: {gone}")
            return
        except Exception:
            response, reference = server_error("internal error; see the server log")
            log.exception("request failed (reference %s)", reference)
        try:
            body.drain()
        except (OSError, HttpError):
            body.unreadable = True
        if body.unreadable:
            self.close_connection = True
        self._send(response)
        self._log(started, response.status, response.note)

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def _log(self, started: float, status: int, note: str) -> None:
        line = f"{self.client_address[0]} {self.command} {self.path} -> {status}"
        if note:
            line += f" {note}"
        log.info("%s (%.0f ms)", self.server.redact(line), (time.perf_counter() - started) * 1000)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Silenced: `_log` writes one line per request with the outcome."""

    def log_message(self, format: str, *args: object) -> None:
        # Protocol errors (malformed request line, timeouts); they quote the request line, never headers.
        log.warning("%s", self.server.redact(f"{self.client_address[0]} {format % args}"))
