"""Logging: one line per event, secrets scrubbed from every message and field as a last line of defence.

The driver configures it at start (`configure`); a Spark Python worker is a process of its own that
nothing configured, so without `configure_worker` its lines (upload retries, parked files, bad
records) came out bare through Python's last-resort handler, unscrubbed. The driver's settings
travel to the workers in the task spec (`current`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sink_service.config import MASK
from uploader.masking import mask_userinfo


class SecretScrubber(logging.Filter):
    """Replaces any configured secret value, and any credential written into a URL, that reaches a
    log record, however it got there: message, arguments, exception text or `extra={"fields": ...}`."""

    def __init__(self, secrets: Iterable[str]):
        super().__init__()
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        # The credential part alone ("AppKey abc" -> "abc") must not leak either.
        for secret in list(self._secrets):
            _scheme, _, credential = secret.partition(" ")
            if credential and len(credential) >= 4:
                self._secrets.append(credential)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return mask_userinfo(text, MASK)

    def scrub_value(self, value: Any) -> Any:
        """A structured field, scrubbed throughout; anything but JSON scalars becomes its scrubbed str(),
        which is how the JSON formatter would print it anyway."""
        if isinstance(value, str):
            return self.scrub(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, dict):
            return {self.scrub(str(k)): self.scrub_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub_value(v) for v in value]
        return self.scrub(str(value))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format call must not break the caller
            message = f"{record.msg} {record.args}"
        message = self.scrub(message)
        record.msg, record.args = message, None
        if record.exc_info:
            record.exc_text = self.scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        if hasattr(record, "fields"):
            record.fields = self.scrub_value(record.fields)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event.update(getattr(record, "fields", {}))
        if record.exc_text:
            event["exception"] = record.exc_text
        return json.dumps(event, default=str)


@dataclass(frozen=True)
class WorkerLogging:
    """The driver's logging settings, for the Spark Python workers (pickled into the task spec)."""

    level: str
    json_format: bool
    secrets: tuple[str, ...] = field(repr=False)


_active: WorkerLogging | None = None  # what `configure` set up in this process


def current() -> WorkerLogging | None:
    """The settings `configure` applied in this process (the driver's), or None if it never ran."""
    return _active


def configure_worker(settings: WorkerLogging | None) -> None:
    """In a Spark Python worker: the driver's format and scrubber, installed once per process
    (a no-op in the driver itself, and where the task spec carries none)."""
    if settings is not None and settings != _active:
        configure(settings.level, settings.secrets, settings.json_format)


def configure(level: str, secrets: Iterable[str], json_format: bool = False) -> SecretScrubber:
    global _active
    secrets = tuple(s for s in secrets if s)
    _active = WorkerLogging(level, json_format, secrets)
    handler = logging.StreamHandler(sys.stderr)
    scrubber = SecretScrubber(secrets)
    handler.addFilter(scrubber)
    handler.setFormatter(
        JsonFormatter() if json_format else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return scrubber
