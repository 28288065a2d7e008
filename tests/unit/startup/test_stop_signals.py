"""A stop signal is never lost, whenever it arrives: each case runs in a fresh interpreter, laid out the
way `python -m sink_service` is (stop signals held first, then imports that start native threads)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import os, signal, time
from sink_service.startup.stop_signals import hold_stop_signals, release_stop_signals, sigterm_ignored_by_children
hold_stop_signals()
import pyarrow  # starts a native thread at import: it must not take a SIGTERM while it is ignored
handled = []
signal.signal(signal.SIGTERM, lambda signum, frame: handled.append(signum))
"""


def _handled(body: str) -> str:
    script = PRELUDE + textwrap.dedent(body) + "\nprint('handled', handled)\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("body", [
    # Sent to the process while the JVM would be starting, as an orchestrator does.
    """
    with sigterm_ignored_by_children():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
    release_stop_signals()
    """,
    # Sent before, still held: ignoring SIGTERM would discard it.
    """
    os.kill(os.getpid(), signal.SIGTERM)
    with sigterm_ignored_by_children():
        time.sleep(0.1)
    release_stop_signals()
    """,
    # Sent during configuration, before the service's handler is installed: it waits for it.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    signal.signal(signal.SIGTERM, lambda signum, frame: handled.append(signum))
    release_stop_signals()
    """,
], ids=["while SIGTERM is ignored", "pending before it is ignored", "before the handler exists"])
def test_a_stop_signal_reaches_the_handler_exactly_once(body):
    assert _handled(body) == f"handled [{int(__import__('signal').SIGTERM)}]"


def test_a_child_started_meanwhile_ignores_sigterm():
    body = """
    import subprocess, sys
    with sigterm_ignored_by_children():
        # Like the JVM, the child unblocks SIGTERM (it inherits the mask) but keeps an inherited SIG_IGN.
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM]); time.sleep(30)"])
    release_stop_signals()
    child.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    alive = child.poll() is None
    child.kill()
    print("child alive after SIGTERM:", alive)
    """
    assert _handled(body).splitlines()[0] == "child alive after SIGTERM: True"
