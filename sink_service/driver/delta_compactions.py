"""Driver side of change-log mode: compactions of the change log into the keyed table, beside the batches.

Run in one background thread, which looks whether a table's compaction is due
(uploader.delta_compaction.Compaction.due) after each batch's Kafka commit and every POLL_S while idle (so
changes are compacted within SINK_DELTA_COMPACT_MAX_INTERVAL_S even when no batch comes): a compaction of a
large table takes seconds to minutes, and the batches' appends (what readers see through the view) must not
wait for it. Nothing Kafka's commit depends on
happens here: the change log already holds every committed record, so a compaction that fails is only retried
after the next batch (counted `retry`), and a crash or SIGTERM in the middle leaves the keyed table's per-bucket
transactions saying exactly what it holds. A compaction that can never succeed (the keyed table refuses the
change log's types, credentials) stops the service at the next batch, as a merge would.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from sink_service.driver.metrics import SinkMetrics
from uploader.delta_compaction import Compaction
from uploader.delta_settings import DeltaSettings
from uploader.errors import FatalUploadError, RetryableUploadError
from uploader.target import FileMetadata

log = logging.getLogger(__name__)

POLL_S = 10.0


class BackgroundCompactions:
    def __init__(self, settings: DeltaSettings, scratch: Path, metrics: SinkMetrics) -> None:
        self.compaction = Compaction(settings, scratch / "delta-compaction")
        self.metrics = metrics
        # topic -> (keys, order); None until found: a table known at the start, whose keys its change log names
        self._tables: dict[str, tuple[tuple[str, ...], str | None] | None] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failure: FatalUploadError | None = None

    def known(self, topics: set[str]) -> None:
        """At a query's start: the assigned topics, whose change logs may hold changes from before a restart
        that no new batch will bring up (compacted within the max interval all the same)."""
        for topic in topics:
            self._tables.setdefault(topic, None)
        self.wake()

    def appended(self, files: list[FileMetadata]) -> None:
        """The topics a batch appended to, with their keys: what a compaction merges them by."""
        for metadata in files:
            self._tables[metadata.topic] = (tuple(metadata.primary_keys), metadata.order_column)

    def check(self) -> None:
        """Raise the fatal failure of a compaction, so the batch stops the service with its message."""
        if self._failure is not None:
            raise self._failure

    def wake(self) -> None:
        """After a batch's Kafka commit: look now (the thread starts with the first batch)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="delta-compaction", daemon=True)
            self._thread.start()
        self._wake.set()

    def stop(self, timeout_s: float) -> bool:
        """At shutdown: let a running compaction finish its bucket (each bucket is one atomic commit) and end the
        thread, so no delta-rs call is left running while the interpreter exits; then close the compaction's S3
        clients. False when it did not end (its clients are left to it)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("a compaction of the change log was still running after %.0fs at shutdown; what it "
                            "committed holds, the rest is compacted after the restart", timeout_s)
                return False
        self.compaction.close()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_S)
            self._wake.clear()
            if not self._stop.is_set():
                self._round(dict(self._tables))

    def _round(self, tables: dict[str, tuple[tuple[str, ...], str | None] | None]) -> None:
        for topic, merged_by in sorted(tables.items()):
            try:
                if merged_by is None:
                    merged_by = self._tables[topic] = self._tables.get(topic) or self.compaction.merged_by(topic)
                if merged_by is None or not self.compaction.due(topic):
                    continue
                keys, order = merged_by
                started = time.monotonic()
                result = self.compaction.compact(topic, keys, order, stop=self._stop)
                took = time.monotonic() - started
                self.metrics.delta_compaction_duration.observe(took)
                self.metrics.delta_compactions.labels("ok").inc()
                log.info("compacted the change log of %s into the keyed table: %d bucket(s), %d row(s) through "
                         "change-log version %s in %.2fs", self.compaction.settings.uri_for(topic),
                         result.get("buckets", 0), result.get("rows", 0), result.get("version"), took,
                         extra={"fields": {"event": "delta_compaction", "duration_s": round(took, 3),
                                           **{k: v for k, v in result.items() if k != "duration_s"}}})
            except RetryableUploadError as exc:
                self.metrics.delta_compactions.labels("retry").inc()
                log.warning("compaction of the change log of %s failed (tried again after the next batch; the "
                            "view shows every record meanwhile): %s", self.compaction.settings.uri_for(topic), exc)
            except FatalUploadError as exc:
                self.metrics.delta_compactions.labels("fatal").inc()
                self._failure = exc
            except Exception as exc:  # never kill the thread silently; the next round tries again
                self.metrics.delta_compactions.labels("retry").inc()
                log.exception("compaction of the change log of %s failed: %s",
                              self.compaction.settings.uri_for(topic), exc)
