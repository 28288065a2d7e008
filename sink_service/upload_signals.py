"""Live upload signals: executors tell the driver about uploads while they are still retrying.

A task reports its outcome only when it ends, and an upload retries inside the task for up to
`SINK_UPLOAD_RETRY_BUDGET_MS`: without a live channel an endpoint outage would show in
`/readyz` and the metrics only a minute after it began. Each task posts small JSON events to
the driver's HTTP server (which executors on a cluster can reach): an upload started, retried
(with the reason), or finished. The driver keeps the uploads in flight, so readiness turns false
at the first retry and true again at the first success, and the oldest in-flight upload's age is
a gauge. Best effort by design: a lost event delays a signal, it never changes delivery.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

log = logging.getLogger(__name__)

SIGNAL_PATH = "/internal/upload-signal"
SEND_TIMEOUT_S = 0.5

TaskKey = tuple[str, int, int]  # topic, partition, range start


@dataclass(frozen=True)
class SignalChannel:
    """Where a task sends its signals; `url` empty means no channel (HTTP server disabled)."""

    url: str
    token: str


NO_SIGNALS = SignalChannel("", "")


class SignalSender:
    """Executor side: one per task; never raises, never blocks an upload for long."""

    def __init__(self, channel: SignalChannel, task: TaskKey):
        self._channel = channel
        self._task = list(task)

    def send(self, kind: str, file: str, **fields: object) -> None:
        if not self._channel.url:
            return
        event = {"token": self._channel.token, "kind": kind, "task": self._task, "file": file,
                 "at": time.time(), **fields}
        _post(self._channel.url, json.dumps(event))


_local = threading.local()


def _post(url: str, body: str) -> None:
    """Best effort, on one HTTP session per thread; requests loads here, on executors only (the
    driver imports this module on its way to the JVM's launch)."""
    import requests

    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    try:
        session.post(url, data=body, timeout=SEND_TIMEOUT_S)
    except requests.RequestException as exc:
        log.debug("upload signal not delivered: %s", exc)


@dataclass
class _InFlight:
    started_at: float
    retries: int = 0
    reason: str = ""
    error: str = ""


class LiveUploads:
    """Driver side: uploads in flight as the signals describe them. Thread-safe."""

    def __init__(self, token: str):
        self.token = token
        self._lock = threading.Lock()
        self._uploads: dict[tuple[TaskKey, str], _InFlight] = {}
        self._retries_seen: dict[TaskKey, Counter] = {}

    def receive(self, body: bytes) -> tuple[int, str | None]:
        """Apply one event; returns (HTTP status, the retry reason to count, if any)."""
        try:
            event = json.loads(body)
            if event.get("token") != self.token:
                return 403, None
            task: TaskKey = (str(event["task"][0]), int(event["task"][1]), int(event["task"][2]))
            key, kind = (task, str(event["file"])), event["kind"]
        except (ValueError, KeyError, TypeError, IndexError):
            return 400, None
        with self._lock:
            if kind == "started":
                self._uploads[key] = _InFlight(float(event["at"]))
            elif kind == "finished":
                self._uploads.pop(key, None)
            elif kind == "retry":
                upload = self._uploads.setdefault(key, _InFlight(float(event.get("started_at", event["at"]))))
                upload.retries += 1
                upload.reason, upload.error = str(event.get("reason", "")), str(event.get("error", ""))[:300]
                self._retries_seen.setdefault(task, Counter())[upload.reason] += 1
                return 200, upload.reason
            else:
                return 400, None
        return 200, None

    def task_ended(self, task: TaskKey) -> Counter:
        """Forget a finished task's uploads; returns its retries the signals counted, by reason."""
        with self._lock:
            for key in [k for k in self._uploads if k[0] == task]:
                del self._uploads[key]
            return self._retries_seen.pop(task, Counter())

    def clear(self) -> None:
        """A new query: tasks of the old one are gone, whatever they last said."""
        with self._lock:
            self._uploads.clear()
            self._retries_seen.clear()

    def oldest_age_s(self, now: float) -> float:
        with self._lock:
            return max((now - u.started_at for u in self._uploads.values()), default=0.0)

    def failing(self) -> str | None:
        """Why uploads are failing right now, or None: any upload in flight that has retried."""
        with self._lock:
            retrying = [(key, u) for key, u in self._uploads.items() if u.retries]
            if not retrying:
                return None
            (topic, partition, _), file = retrying[0][0]
            upload = retrying[0][1]
            return (f"{len(retrying)} upload(s) retrying, e.g. {file} (topic={topic} partition={partition}) "
                    f"after {upload.retries} attempt(s): {upload.reason}: {upload.error}")
