"""SIGTERM and SIGINT belong to the main thread, and none is lost, from the service's first moment.

An orchestrator may stop a service that has only just started (a rollout, a rescheduled node), so a
stop signal must be kept whenever it arrives: while configuration and logging are set up, and while
the JVM starts with SIGTERM ignored. `hold_stop_signals` runs before any import that may start a
thread (pyarrow starts one at import): every thread started afterwards inherits the block, so none
can take a stop signal and drop it while SIGTERM is ignored. Linux keeps a blocked signal pending and
delivers it to the main thread's handler once `release_stop_signals` unblocks it. Kept free of heavy
imports: it runs before them.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def hold_stop_signals() -> None:
    """Block the stop signals in this thread and in every thread it starts from now on."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def release_stop_signals() -> None:
    """Unblock the stop signals in this thread: one that arrived while held is handled now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold the stop signals for this thread, and for the threads started inside, for a while."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def sigterm_ignored_by_children() -> Iterator[None]:
    """SIGTERM ignored while a child process (the JVM) starts, so that it inherits the ignoring and a
    SIGTERM sent to the whole process group cannot kill it before the service has drained.

    A SIGTERM for this process is kept meanwhile: blocked, it stays pending instead of being ignored.
    Ignoring a signal discards one already pending, so that one is taken first and raised again after.
    """
    with stop_signals_held():
        pending = signal.sigtimedwait([signal.SIGTERM], 0)
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
            if pending is not None:
                signal.raise_signal(signal.SIGTERM)  # pending for this thread until the block is lifted
