"""Liveness and readiness over HTTP.

`/healthz` answers 200 while the process serves HTTP. `/readyz` answers 200 only while the
streaming query runs, the broker answered recently, the last micro-batch did not fail and no
upload in flight is retrying (live signals from executors, `upload_signals.py`); otherwise 503
with the reason, so an orchestrator stops routing to (or alerts on) the pod. `/metrics` is the
Prometheus exposition; executors POST their upload signals to the same server.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sink_service.stop_signals import stop_signals_held

MetricsRenderer = Callable[[], tuple[bytes, str]]  # -> (body, content type)
SignalReceiver = Callable[[bytes], int]  # request body -> HTTP status


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
            return ready, {
                "ready": ready,
                "query_running": self.query_running,
                "broker_reachable": self.broker_ok,
                "last_batch_ok": self.last_batch_ok,
                "uploads_ok": failing is None,
                "stopping": self.stopping,
                "reason": "" if ready else (failing if failing and self.last_batch_ok else self.reason),
                "last_commit_at": self.last_commit_at,
            }


def _handler(health: Health, metrics: MetricsRenderer | None,
             signals: tuple[str, SignalReceiver] | None) -> type[BaseHTTPRequestHandler]:
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

        def do_POST(self) -> None:
            if signals is None or self.path != signals[0]:
                self._send(404, b'{"error": "not found"}')
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > 64 * 1024:
                self._send(413, b'{"error": "too large"}')
                return
            self._send(signals[1](self.rfile.read(length)), b"{}")

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the log

    return Handler


class HealthServer:
    def __init__(self, health: Health, port: int, metrics: MetricsRenderer | None = None,
                 signals: tuple[str, SignalReceiver] | None = None):
        self._server = ThreadingHTTPServer(("0.0.0.0", port), _handler(health, metrics, signals))
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
