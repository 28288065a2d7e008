"""LocalEmsClient: the inspection and fault methods of LocalEmsServer, over HTTP.

For when the endpoint runs as a separate process (`python -m local_ems`), e.g. in the benchmark.
Standard library only, so it works in any interpreter that can import this package.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode


class LocalEmsClient:
    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        """`base_url` is the server's root, e.g. http://127.0.0.1:18080 (an items URL works too)."""
        marker = "/continuous-batch-processing/"
        self.base_url = base_url.split(marker, 1)[0].rstrip("/")
        self.timeout_s = timeout_s

    def items_url(self, pool_id: str = "pool-1") -> str:
        return f"{self.base_url}/continuous-batch-processing/api/v1/{quote(pool_id, safe='')}/items"

    def healthy(self) -> bool:
        try:
            return self._call("GET", "/healthz", raw=True) == b"ok\n"
        except (OSError, urllib.error.URLError):
            return False

    def wait_healthy(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"local EMS endpoint at {self.base_url} not healthy after {timeout_s}s")
            time.sleep(0.05)

    def table(self, target_name: str) -> list[dict[str, Any]]:
        """Current rows as dicts; [] while no upload has created the table."""
        found = self._call("GET", f"/_control/tables/{quote(target_name, safe='')}", missing=None)
        if found is None:
            return []
        return [dict(zip(found["columns"], row, strict=True)) for row in found["rows"]]

    def count(self, target_name: str) -> int:
        found = self._call("GET", f"/_control/tables/{quote(target_name, safe='')}/count", missing=None)
        return 0 if found is None else int(found["count"])

    def uploads(self, target_name: str | None = None) -> list[dict[str, Any]]:
        query = f"?{urlencode({'targetName': target_name})}" if target_name is not None else ""
        return self._call("GET", f"/_control/uploads{query}")

    def inject_fault(self, status: int | None = None, count: int | None = None, seconds: float | None = None,
                     retry_after: int | str | None = None, delay_ms: float | None = None) -> dict[str, Any]:
        fields = {"status": status, "count": count, "seconds": seconds, "retry_after": retry_after,
                  "delay_ms": delay_ms}
        return self._call("POST", "/_control/faults", {k: v for k, v in fields.items() if v is not None})

    def clear_faults(self) -> None:
        self._call("DELETE", "/_control/faults")

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/_control/stats")

    def _call(self, method: str, path: str, payload: Any = None, *, missing: Any = ..., raw: bool = False) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            if error.code == 404 and missing is not ...:
                return missing
            detail = error.read().decode("utf-8", "replace").strip()
            raise RuntimeError(f"{method} {path} -> HTTP {error.code}: {detail}") from None
        return body if raw else json.loads(body)
