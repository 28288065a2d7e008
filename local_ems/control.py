"""Inspection and fault injection: the `/_control/` HTTP API and the same operations in-process.

Routes (no auth; the HTTP layer answers them on loopback connections only):
  POST   /_control/faults                {"status": 503, "count": 5, "seconds": 20, "retry_after": 2,
                                          "delay_ms": 500}  (all optional, but status or delay_ms)
  GET    /_control/faults                the active fault, or null
  DELETE /_control/faults                clear it
  GET    /_control/uploads[?targetName=] upload log entries, oldest first
  GET    /_control/tables/<targetName>        {"columns": [...], "rows": [[...], ...]}; 404 if absent
  GET    /_control/tables/<targetName>/count  {"count": n}; 404 if absent
  GET    /_control/stats                 items POSTs by status code, uploads, rows, bytes, upsert mode
"""

from __future__ import annotations

import json
from typing import Any

from local_ems.faults import FaultInjector
from local_ems.request import Request
from local_ems.responses import HttpError, Response, as_json
from local_ems.stats import RequestStats
from local_ems.store import UpsertStore

_FAULT_FIELDS = ("status", "count", "seconds", "retry_after", "delay_ms")
_MAX_CONTROL_BODY = 1 << 20


class Control:
    def __init__(self, store: UpsertStore, faults: FaultInjector, stats: RequestStats) -> None:
        self._store = store
        self._faults = faults
        self._stats = stats

    # The in-process API (LocalEmsServer delegates here).

    def table(self, target_name: str) -> list[dict[str, Any]]:
        """Rows as dicts; an empty list while no upload has created the table."""
        found = self._store.table(target_name)
        if found is None:
            return []
        columns, rows = found
        return [dict(zip(columns, row, strict=True)) for row in rows]

    def count(self, target_name: str) -> int:
        return self._store.count(target_name) or 0

    def uploads(self, target_name: str | None = None) -> list[dict[str, Any]]:
        return self._store.uploads(target_name)

    def inject_fault(self, status: int | None = None, count: int | None = None, seconds: float | None = None,
                     retry_after: int | str | None = None, delay_ms: float | None = None) -> dict[str, Any]:
        return self._faults.set(status, count, seconds, retry_after, delay_ms)

    def clear_faults(self) -> None:
        self._faults.clear()

    def stats(self) -> dict[str, Any]:
        return {**self._stats.snapshot(), "fault": self._faults.state(), "upsert_mode": self._store.upsert_mode}

    # The HTTP API.

    def handle(self, request: Request) -> Response:
        """`request.segments` starts with "_control"."""
        route, method = request.segments[1:], request.method
        if route == ("faults",):
            if method == "POST":
                return as_json(200, self.inject_fault(**_fault_arguments(request.body.read(_MAX_CONTROL_BODY))))
            if method == "DELETE":
                self.clear_faults()
                return as_json(200, None)
            _require_get(method)
            return as_json(200, self._faults.state())
        _require_get(method)
        if route == ("uploads",):
            return as_json(200, self.uploads(request.first("targetName")))
        if route == ("stats",):
            return as_json(200, self.stats())
        if len(route) == 2 and route[0] == "tables":
            found = self._store.table(route[1])
            if found is None:
                raise HttpError(404, f"no table {route[1]!r}: no upload has created it")
            return as_json(200, {"columns": found[0], "rows": found[1]})
        if len(route) == 3 and route[0] == "tables" and route[2] == "count":
            count = self._store.count(route[1])
            if count is None:
                raise HttpError(404, f"no table {route[1]!r}: no upload has created it")
            return as_json(200, {"count": count})
        raise HttpError(404, f"no control route /{'/'.join(request.segments)}")


def _require_get(method: str) -> None:
    if method not in ("GET", "HEAD"):
        raise HttpError(405, f"method {method} is not allowed here")


def _fault_arguments(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except ValueError as error:
        raise HttpError(400, f"fault body is not JSON: {error}") from error
    if not isinstance(value, dict):
        raise HttpError(400, "fault body must be a JSON object")
    unknown = sorted(set(value) - set(_FAULT_FIELDS))
    if unknown:
        raise HttpError(400, f"unknown fault field(s) {unknown}; known: {list(_FAULT_FIELDS)}")
    return value
