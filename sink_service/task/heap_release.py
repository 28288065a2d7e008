"""Executor side: give the memory of a finished range read back to the operating system.

librdkafka allocates every fetched message with malloc, and a broker may answer one fetch with a
partition's whole backlog whatever `fetch.max.bytes` says (noida-db does: 500k records held at
once, ~290 MB). When the range is done glibc keeps those pages in its free lists, so a long-lived
Python worker stays at its largest read for good, and the next read adds its own on top. Measured
on a 250k-record range of a 500k-record partition: 342 MB resident after the read without this,
194 MB (the worker's size before it) with it, and the next read peaked at 433 MB instead of 563.

Trimming walks the heap (10-30 ms after such a read), so it runs only when the worker has grown
by `GROWTH_BYTES` since the last trim: never in a live run's small reads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

GROWTH_BYTES = 64 << 20
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None elsewhere (musl, macOS): then memory is left to the allocator."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


_malloc_trim = _load_malloc_trim()
_trimmed_at = 0  # resident bytes right after the last trim


def resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except OSError:
        return 0


def release_if_grown(free_first: Callable[[], object] | None = None) -> bool:
    """Return freed heap pages to the OS if the process grew by `GROWTH_BYTES`; True if it trimmed.

    `free_first` runs only when a trim follows: whatever it frees is handed back too."""
    global _trimmed_at
    if _malloc_trim is None or resident_bytes() - _trimmed_at < GROWTH_BYTES:
        return False
    if free_first is not None:
        free_first()
    _malloc_trim(0)
    _trimmed_at = resident_bytes()
    return True
