"""Counters of items POSTs since start, so tests and the benchmark can see what the endpoint saw."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


class RequestStats:
    """Thread-safe. Counts items POSTs only; control and health requests are not counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_status: Counter[int] = Counter()
        self._rows = 0
        self._bytes = 0
        self._uploads = 0

    def record(self, status: int, rows: int = 0, size: int = 0) -> None:
        with self._lock:
            self._by_status[status] += 1
            if status == 200:
                self._uploads += 1
                self._rows += rows
                self._bytes += size

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": {str(status): n for status, n in sorted(self._by_status.items())},
                "total_requests": sum(self._by_status.values()),
                "uploads": self._uploads,
                "rows": self._rows,
                "bytes": self._bytes,
            }
