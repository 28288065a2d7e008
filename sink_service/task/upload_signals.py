"""Live upload signals: executors tell the driver about uploads while they are still retrying.

A task reports its outcome only when it ends, and an upload retries inside the task for up to
`SINK_UPLOAD_RETRY_BUDGET_MS`: without a live channel an endpoint outage would show in
`/readyz` and the metrics only a minute after it began. Each task posts small JSON events to
the driver's HTTP server (which executors on a cluster can reach): an upload started (once it has
run a second: quicker ones are never announced), retried (with the reason), or finished. The
driver keeps the uploads in flight, so readiness turns false at the first retry and true again at
the first success, and the oldest in-flight upload's age is a gauge. Best effort by design: a
lost event delays a signal, it never changes delivery.

This module is the executor's side (and the wire format); the driver's receiver is
`sink_service/driver/live_uploads.py`.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

SIGNAL_PATH = "/internal/upload-signal"
# The per-start token travels in a header, so the driver refuses a stranger before reading a body.
TOKEN_HEADER = "X-Sink-Signal-Token"
# An error text is cut to this before it is sent: the driver keeps 300 characters and refuses a
# body above 64 KiB (`health.MAX_SIGNAL_BYTES`).
MAX_ERROR_CHARS = 1000
SEND_TIMEOUT_S = 0.5
# An upload that ends sooner than this is never announced: readiness and the in-flight gauge are
# about uploads that fail or hang, and two posts per file cost the task worker and the driver CPU
# that a live rate pays on every file.
ANNOUNCE_AFTER_S = 1.0

TaskKey = tuple[str, int, int]  # topic, partition, range start


def signal_url(bind_host: str, port: int, driver_host: str) -> str:
    """Where executors post: the driver's address as Spark knows it while the server listens on
    every interface, else the one address it is bound to (`SINK_HTTP_HOST`)."""
    host = driver_host if bind_host in ("", "0.0.0.0", "::") else bind_host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{SIGNAL_PATH}"


@dataclass(frozen=True)
class SignalChannel:
    """Where a task sends its signals; `url` empty means no channel (HTTP server disabled)."""

    url: str
    token: str


NO_SIGNALS = SignalChannel("", "")


class SignalSender:
    """Executor side: one per task, for its uploads one at a time; never raises, never blocks an
    upload for long."""

    def __init__(self, channel: SignalChannel, task: TaskKey):
        self._channel = channel
        self._task = list(task)
        self._lock = threading.Lock()
        self._upload: tuple[str, float] | None = None  # (file, started at) of the upload in flight
        self._announced = False

    def started(self, file: str) -> None:
        """An upload began: the driver hears of it only if it is still running `ANNOUNCE_AFTER_S` later."""
        if not self._channel.url:
            return
        upload = (file, time.time())
        with self._lock:
            self._upload, self._announced = upload, False
        _announcer.schedule(ANNOUNCE_AFTER_S, self, upload)

    def retried(self, reason: str, error: str) -> None:
        """The upload in flight failed and will be tried again: the driver hears of it at once."""
        with self._lock:
            upload = self._upload
            self._announced = upload is not None
        if upload is not None:
            file, started_at = upload
            self._send("retry", file, reason=reason[:200], error=error[:MAX_ERROR_CHARS], started_at=started_at)

    def finished(self, file: str) -> None:
        with self._lock:
            announced = self._announced
            self._upload, self._announced = None, False
        if announced:
            self._send("finished", file)

    def _announce(self, file: str, started_at: float) -> None:
        # Under the lock, so a "finished" can never overtake the "started" it ends. An upload that
        # already finished (or was followed by another) is no longer `_upload`: nothing to say.
        with self._lock:
            if self._upload != (file, started_at) or self._announced:
                return
            self._announced = True
            self._send("started", file, at=started_at)

    def _send(self, kind: str, file: str, **fields: object) -> None:
        if not self._channel.url:
            return
        event = {"kind": kind, "task": self._task, "file": file, "at": time.time(), **fields}
        _post(self._channel.url, self._channel.token, json.dumps(event))


class _Announcer:
    """One daemon thread per process makes every sender's due announcements.

    A `threading.Timer` per upload started and ended a thread for every file, about 0.12 ms of CPU
    each: with many partitions every small file paid it. An upload that finishes in time leaves its
    entry to lapse. Announcements are made one after another, each post bounded by `SEND_TIMEOUT_S`.
    """

    def __init__(self) -> None:
        self._due: list[tuple[float, int, SignalSender, tuple[str, float]]] = []  # a heap by due time
        self._order = itertools.count()  # ties by scheduling order; senders are not comparable
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def schedule(self, delay_s: float, sender: SignalSender, upload: tuple[str, float]) -> None:
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sink-upload-signals", daemon=True)
                self._thread.start()
            heapq.heappush(self._due, (time.monotonic() + delay_s, next(self._order), sender, upload))
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, sender, upload = heapq.heappop(self._due)
            sender._announce(*upload)


_announcer = _Announcer()


def _after_fork() -> None:
    """A forked process has no announcing thread (nor a lock held by one): it starts its own."""
    global _announcer
    _announcer = _Announcer()


os.register_at_fork(after_in_child=_after_fork)

_local = threading.local()


def _post(url: str, token: str, body: str) -> None:
    """Best effort, on one HTTP session per thread; requests loads here, on executors only (the
    driver imports this module on its way to the JVM's launch)."""
    import requests

    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    try:
        session.post(url, data=body.encode(), headers={TOKEN_HEADER: token}, timeout=SEND_TIMEOUT_S)
    except requests.RequestException as exc:
        log.debug("upload signal not delivered: %s", exc)
