"""SIGTERM and SIGINT noted from the service's first moment, before it can act on them.

An orchestrator may stop a service that has only just started (a rollout, a rescheduled node).
Without this, a signal that arrives while configuration, logging and Spark are being set up kills
the process instead of stopping it. Kept free of heavy imports: it is installed before them.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


class StopLatch:
    """Notes a stop signal until the service installs its own handlers and asks what it missed."""

    def __init__(self) -> None:
        self.signum: int | None = None
        signal.signal(signal.SIGTERM, self._note)
        signal.signal(signal.SIGINT, self._note)

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold SIGTERM and SIGINT for this thread: Linux keeps them pending (never discards a blocked signal,
    even an ignored one) and delivers them on leaving. Threads started inside inherit the block, so a
    stop signal is never taken by a thread that would let it go while the main thread ignores it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
