"""Liveness and readiness over HTTP.

`/healthz` answers 200 while the process serves HTTP. `/readyz` answers 200 only while the
streaming query runs, the broker answered recently, the last micro-batch did not fail and no
upload in flight is retrying (live signals from executors, `upload_signals.py`); otherwise 503
with the reason, so an orchestrator stops routing to (or alerts on) the pod. `/metrics` is the
Prometheus exposition; executors POST their upload signals to the same server, with a per-start
token in a header. The port is open to whoever reaches `SINK_HTTP_HOST`: a POST's token and
length are checked from its headers, so a stranger never makes the driver read (or wait for) a
body, and a client that stops sending loses its thread after `request_timeout_s`.
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sink_service.startup.stop_signals import stop_signals_held
from sink_service.task.upload_signals import TOKEN_HEADER

MetricsRenderer = Callable[[], tuple[bytes, str]]  # -> (body, content type)
SignalReceiver = Callable[[bytes], int]  # request body -> HTTP status

# An upload signal is a few hundred bytes; nothing larger is ever read.
MAX_SIGNAL_BYTES = 64 * 1024


@dataclass(frozen=True)
class SignalEndpoint:
    """Where executors POST their upload signals, the token they must send in `TOKEN_HEADER`
    (checked before a byte of the body is read), and who gets the body."""

    path: str
    token: str
    receive: SignalReceiver


# Why a 503 when nothing else says: between queries (the group moved partitions, the start is underway).
NOT_RUNNING = "no query running: starting, or restarting on the group's new assignment"


@dataclass
class Health:
    started_at: float = field(default_factory=time.time)
    query_running: bool = False
    broker_ok: bool = False
    last_batch_ok: bool = True
    stopping: bool = False
    reason: str = "starting"
    last_commit_at: float | None = None
    # Why uploads in flight are failing right now (live signals from executors), or None.
    uploads_failing: Callable[[], str | None] = field(default=lambda: None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def update(self, **changes: object) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(self, name, value)

    def readiness(self) -> tuple[bool, dict]:
        failing = self.uploads_failing()
        with self._lock:
            ready = (self.query_running and self.broker_ok and self.last_batch_ok and not self.stopping
                     and failing is None)
            reason = ""
            if not ready:
                reason = (failing if failing and self.last_batch_ok else self.reason) or (
                    "" if self.query_running else NOT_RUNNING)
            return ready, {
                "ready": ready,
                "query_running": self.query_running,
                "broker_reachable": self.broker_ok,
                "last_batch_ok": self.last_batch_ok,
                "uploads_ok": failing is None,
                "stopping": self.stopping,
                "reason": reason,
                "last_commit_at": self.last_commit_at,
            }


def _handler(health: Health, metrics: MetricsRenderer | None,
             signals: SignalEndpoint | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, b'{"alive": true}')
            elif self.path == "/readyz":
                ready, detail = health.readiness()
                self._send(200 if ready else 503, json.dumps(detail).encode())
            elif self.path == "/metrics" and metrics is not None:
                body, content_type = metrics()
                self._send(200, body, content_type)
            else:
                self._send(404, b'{"error": "not found"}')

        def _refuse(self, status: int, error: str) -> None:
            # The body (if any) stays unread: the connection closes after this answer.
            self.close_connection = True
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body := json.dumps({"error": error}).encode())))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            # The port is reachable by anyone on the network: token and length are checked from
            # the headers alone, so a stranger never gets the server to read, or wait for, a body.
            if signals is None or self.path != signals.path:
                self._refuse(404, "not found")
                return
            token = self.headers.get(TOKEN_HEADER, "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(token, signals.token.encode()):
                self._refuse(403, "bad or missing token")
                return
            declared = self.headers.get("Content-Length")
            if declared is None:
                self._refuse(411, "Content-Length required")
                return
            declared = declared.strip()
            if not (declared.isascii() and declared.isdigit()):
                self._refuse(400, "invalid Content-Length")
                return
            length = int(declared)
            if length > MAX_SIGNAL_BYTES:
                self._refuse(413, "too large")
                return
            try:
                body = self.rfile.read(length)  # bounded, and by the socket's timeout
            except OSError:
                self.close_connection = True  # timed out or went away mid-body
                return
            if len(body) < length:
                self.close_connection = True
                return
            self._send(signals.receive(body), b"{}")

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the log

    return Handler


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class HealthServer:
    def __init__(self, health: Health, port: int, metrics: MetricsRenderer | None = None,
                 signals: SignalEndpoint | None = None, host: str = "0.0.0.0",
                 request_timeout_s: float = 10.0):
        handler = _handler(health, metrics, signals)
        # A client that stops sending mid-request gives its thread back after this long.
        handler.timeout = request_timeout_s
        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        self._server = server_class((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> None:
        # Stop signals are the main thread's (see `stop_signals`): this thread and the request
        # threads it starts inherit a mask that blocks them, from their first instruction on.
        with stop_signals_held():
            self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
