"""The driver's side of the live upload signals (`sink_service/task/upload_signals.py` sends them):
the uploads in flight, for readiness, the in-flight age gauge and the retry counters."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass

from sink_service.task.upload_signals import TaskKey


@dataclass
class _InFlight:
    started_at: float
    retries: int = 0
    reason: str = ""
    error: str = ""


class LiveUploads:
    """Driver side: uploads in flight as the signals describe them. Thread-safe. `token` is the
    one senders put in `TOKEN_HEADER`; the HTTP server checks it before the body reaches here."""

    def __init__(self, token: str):
        self.token = token
        self._lock = threading.Lock()
        self._uploads: dict[tuple[TaskKey, str], _InFlight] = {}
        self._retries_seen: dict[TaskKey, Counter] = {}

    def receive(self, body: bytes) -> tuple[int, str | None]:
        """Apply one event; returns (HTTP status, the retry reason to count, if any)."""
        try:
            event = json.loads(body)
            task: TaskKey = (str(event["task"][0]), int(event["task"][1]), int(event["task"][2]))
            key, kind = (task, str(event["file"])), event["kind"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
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
