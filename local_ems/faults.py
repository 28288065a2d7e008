"""Fault injection: make the endpoint fail or slow down on purpose, the way a real one does.

A fault is an optional status (answered instead of processing the upload) and an optional delay,
applied to every items POST while the fault lasts: for `count` requests, for `seconds`, whichever
ends first, or until cleared when neither is given. Setting a fault replaces the previous one.
Faulted requests are not stored.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from local_ems.responses import HttpError


@dataclass(frozen=True)
class FaultDecision:
    """What to do with one request: sleep `delay_s`, then answer `status` if it is set."""

    delay_s: float
    status: int | None
    retry_after: str | None


@dataclass
class _Fault:
    status: int | None
    remaining: int | None
    until: float | None  # time.monotonic() deadline
    retry_after: str | None
    delay_ms: float

    def expired(self, now: float) -> bool:
        return (self.remaining is not None and self.remaining <= 0) or (self.until is not None and now >= self.until)


class FaultInjector:
    """Thread-safe; `next_request()` consumes one unit of a counted fault atomically."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fault: _Fault | None = None

    def set(self, status: int | None = None, count: int | None = None, seconds: float | None = None,
            retry_after: int | str | None = None, delay_ms: float | None = None) -> dict[str, Any]:
        """Install a fault (validated; HttpError 400 when the arguments make no sense)."""
        if status is not None and (not isinstance(status, int) or isinstance(status, bool)
                                   or not 100 <= status <= 599):
            raise HttpError(400, f"status must be an HTTP status code (100-599), got {status!r}")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise HttpError(400, f"count must be a positive integer, got {count!r}")
        if seconds is not None and (not _is_number(seconds) or seconds <= 0):
            raise HttpError(400, f"seconds must be a positive number, got {seconds!r}")
        if delay_ms is not None and (not _is_number(delay_ms) or delay_ms < 0):
            raise HttpError(400, f"delay_ms must be a number >= 0, got {delay_ms!r}")
        if status is None and not delay_ms:
            raise HttpError(400, "a fault needs a `status`, a `delay_ms`, or both")
        header = _retry_after_header(retry_after)
        fault = _Fault(status, count, None if seconds is None else time.monotonic() + seconds, header,
                       float(delay_ms or 0))
        with self._lock:
            self._fault = fault
            return _describe(fault)

    def clear(self) -> None:
        with self._lock:
            self._fault = None

    def state(self) -> dict[str, Any] | None:
        with self._lock:
            fault = self._current(time.monotonic())
            return None if fault is None else _describe(fault)

    def next_request(self) -> FaultDecision | None:
        """The fault for the request arriving now, or None to serve it normally."""
        with self._lock:
            fault = self._current(time.monotonic())
            if fault is None:
                return None
            if fault.remaining is not None:
                fault.remaining -= 1
            return FaultDecision(fault.delay_ms / 1000, fault.status, fault.retry_after)

    def _current(self, now: float) -> _Fault | None:
        if self._fault is not None and self._fault.expired(now):
            self._fault = None
        return self._fault


def _retry_after_header(value: int | str | None) -> str | None:
    """Delay-seconds (a non-negative integer) or an HTTP-date, as RFC 9110 allows."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or (isinstance(value, int) and value < 0):
        raise HttpError(400, f"retry_after must be whole seconds >= 0 or an HTTP-date string, got {value!r}")
    return str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _describe(fault: _Fault) -> dict[str, Any]:
    left = None if fault.until is None else max(0.0, round(fault.until - time.monotonic(), 3))
    return {"status": fault.status, "remaining": fault.remaining, "seconds_left": left,
            "retry_after": fault.retry_after, "delay_ms": fault.delay_ms}
