"""SIGTERM and SIGINT noted from the service's first moment, before it can act on them.

An orchestrator may stop a service that has only just started (a rollout, a rescheduled node).
Without this, a signal that arrives while configuration, logging and Spark are being set up kills
the process instead of stopping it. Kept free of heavy imports: it is installed before them.
"""

from __future__ import annotations

import signal
from types import FrameType


class StopLatch:
    """Notes a stop signal until the service installs its own handlers and asks what it missed."""

    def __init__(self) -> None:
        self.signum: int | None = None
        signal.signal(signal.SIGTERM, self._note)
        signal.signal(signal.SIGINT, self._note)

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        self.signum = signum
