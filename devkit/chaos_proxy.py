"""A TCP proxy on 127.0.0.1 that can reset connections, for fault tests of the upload path.

`local_ems` can answer with an error status or slowly; what it cannot do is drop the connection
the way a load balancer or a broken network does. Put this proxy between the service and the
endpoint and call `reset_for(seconds)`: meanwhile every connection, new or open, is closed with
a TCP reset (SO_LINGER 0), which clients see as "connection reset by peer". With no connection open
the window starts at the next one: a service still starting (Spark up in 5-9 s on a slow host) has
none yet, and a window that passed before its first upload tested nothing.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

from devkit.brokers import free_port

_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class ChaosProxy:
    def __init__(self, target_port: int):
        self.port = free_port()
        self._target = ("127.0.0.1", target_port)
        self._reset_until = 0.0
        self._armed_s = 0.0  # a window waiting for the next connection
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.resets = 0
        threading.Thread(target=self._accept, name="chaos-proxy", daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def reset_for(self, seconds: float) -> None:
        with self._lock:
            if not self._open:
                self._armed_s = seconds
                return
            self._reset_until = time.monotonic() + seconds
            for sock in list(self._open):
                self._reset(sock)

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                self._reset(sock)

    def _resetting(self) -> bool:
        with self._lock:
            if self._armed_s:
                self._reset_until, self._armed_s = time.monotonic() + self._armed_s, 0.0
            return time.monotonic() < self._reset_until

    def _reset(self, sock: socket.socket) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            sock.close()
        except OSError:
            pass
        self._open.discard(sock)
        self.resets += 1

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            if self._resetting():
                with self._lock:
                    self._reset(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                for sock in (source, sink):
                    if sock in self._open:
                        self._open.discard(sock)
                        with contextlib.suppress(OSError):
                            sock.close()
