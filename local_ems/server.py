"""LocalEmsServer: the endpoint in a background thread of the current process, for tests and the demo.

    server = LocalEmsServer(tmp_path, "AppKey secret").start()
    requests.post(server.items_url(), params={"targetName": "orders", ...}, files=...)
    server.table("orders")  # -> [{"id": ..., ...}, ...]
    server.stop()

Data directory layout: `ems.sqlite` (tables and the upload log) and `uploads/<targetName>/<id>__<file>`.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from local_ems.control import Control
from local_ems.faults import FaultInjector
from local_ems.http_server import EmsHttpServer
from local_ems.items import ItemsEndpoint
from local_ems.routes import Router
from local_ems.stats import RequestStats
from local_ems.store import ORDER_MODE, UpsertStore, check_upsert_mode

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1 << 30
DEFAULT_POOL_ID = "pool-1"
DATABASE_FILE = "ems.sqlite"
UPLOADS_DIR = "uploads"
_WILDCARD_TO_LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}  # where a local client connects


class LocalEmsServer:
    """An EMS-compatible items endpoint on `host:port` (port 0 picks a free one at start()).

    `upsert_mode="order"` keeps the row with the highest order value across files; "last-upload" lets
    a later file's row replace the stored one regardless of it (see local_ems.store).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        authorization: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        pool_id: str = DEFAULT_POOL_ID,
        upsert_mode: str = ORDER_MODE,
    ) -> None:
        if not authorization:
            raise ValueError("authorization must be the exact header value clients send, e.g. 'AppKey <key>'")
        self.data_dir = Path(data_dir)
        self.host = host
        self.pool_id = pool_id
        self.upsert_mode = check_upsert_mode(upsert_mode)
        self._authorization = authorization
        self._requested_port = port
        self._max_body_bytes = max_body_bytes
        self._faults = FaultInjector()
        self._stats = RequestStats()
        self._store: UpsertStore | None = None
        self._control: Control | None = None
        self._http: EmsHttpServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Bind and serve in a daemon thread; returns self so `LocalEmsServer(...).start()` reads well."""
        if self._http is not None:
            raise RuntimeError("LocalEmsServer is already started")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._store = UpsertStore(self.data_dir / DATABASE_FILE, self.upsert_mode)
        self._control = Control(self._store, self._faults, self._stats)
        items = ItemsEndpoint(self._authorization, self._store, self.data_dir / UPLOADS_DIR, self._faults,
                              self._stats, self._max_body_bytes)
        try:
            self._http = EmsHttpServer(self.host, self._requested_port, Router(items, self._control), self.redact)
        except BaseException:
            self._store.close()
            raise
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"local-ems-{self.port}", daemon=True)
        self._thread.start()
        log.info("local EMS endpoint listening on %s (data in %s, upsert mode %s)", self.items_url(), self.data_dir,
                 self.upsert_mode)
        return self

    def stop(self) -> None:
        """Stop serving, end open connections and close the database; safe to call twice."""
        http, self._http = self._http, None
        if http is None:
            return
        http.shutdown()
        http.server_close()
        http.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._store is not None:
            self._store.close()

    def __enter__(self) -> Self:
        return self.start() if self._http is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._running().server_port

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:18080 (no trailing slash)."""
        host = _WILDCARD_TO_LOOPBACK.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def items_url(self, pool_id: str | None = None) -> str:
        return f"{self.url}/continuous-batch-processing/api/v1/{pool_id or self.pool_id}/items"

    def redact(self, text: str) -> str:
        """Remove the configured Authorization value (and its key part) from a log line."""
        for secret in (self._authorization, self._authorization.partition(" ")[2]):
            if len(secret) >= 4:
                text = text.replace(secret, "***")
        return text

    # Inspection and faults, the same operations as the /_control/ HTTP API.

    def table(self, target_name: str) -> list[dict[str, Any]]:
        """Current rows of a table as dicts; [] while no upload has created it."""
        return self._controls().table(target_name)

    def count(self, target_name: str) -> int:
        return self._controls().count(target_name)

    def uploads(self, target_name: str | None = None) -> list[dict[str, Any]]:
        """Upload log entries (id, pool, targetName, fileName, params, rows, bytes, received_at, path)."""
        return self._controls().uploads(target_name)

    def inject_fault(self, status: int | None = None, count: int | None = None, seconds: float | None = None,
                     retry_after: int | str | None = None, delay_ms: float | None = None) -> dict[str, Any]:
        """Answer the next items POSTs with `status` and/or delay them; see local_ems.faults."""
        return self._controls().inject_fault(status, count, seconds, retry_after, delay_ms)

    def clear_faults(self) -> None:
        self._controls().clear_faults()

    def stats(self) -> dict[str, Any]:
        return self._controls().stats()

    def _running(self) -> EmsHttpServer:
        if self._http is None:
            raise RuntimeError("LocalEmsServer is not running; call start() first")
        return self._http

    def _controls(self) -> Control:
        if self._control is None:
            raise RuntimeError("LocalEmsServer was never started; call start() first")
        return self._control
