"""moto's S3 server with its writes made one at a time, as S3's conditional writes are atomic.

moto (5.2.5, s3/responses.py) checks `If-None-Match: *` and then writes, with no lock between: two
commits of one Delta version that reach it together both got 200 and the second overwrote the first
in the table's log (seen in the Delta chaos run: `…08.json` PUT twice, 78 keys lost). Real S3 refuses
the second (412), which is what delta-rs's put-if-absent commits rely on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.threaded_moto_server import DomainDispatcherApplication, create_backend_app
from moto.server import ThreadedMotoServer

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def serialized_app() -> App:
    """moto's WSGI app; every request that may write runs alone (reads run concurrently)."""
    app = DomainDispatcherApplication(create_backend_app)
    writes = threading.Lock()

    def serialized(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] in ("GET", "HEAD"):
            return app(environ, start_response)
        with writes:
            return list(app(environ, start_response))

    return serialized


class SerializedMotoServer(ThreadedMotoServer):
    """`ThreadedMotoServer` (in this process, on loopback) serving `serialized_app()`."""

    def _server_entry(self) -> None:
        from moto.moto_server.threaded_moto_server import MotoRequestHandler
        from werkzeug.serving import make_server

        self._server = make_server(self._ip_address, self._port, serialized_app(), True,
                                   request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()
