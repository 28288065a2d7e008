"""Driver side of the Delta target: a micro-batch's staged files merged into each table in one commit.

Tasks stage their closed files beside the table (uploader.delta_staging) and report them in their outcome
rows. After the batch and before the Kafka commit, `apply` merges per table the files below each
partition's new commit position, i.e. the contiguous run that commit covers (a file past a failed range
waits for the replay: applying it would record progress over offsets the table lacks). One commit takes
the latest row per key across them and every partition's progress as its application transaction
(uploader.delta.DeltaTarget.merge, which skips and trims what the table holds and retries conflicts).
Only then are the offsets committed to Kafka and the staged files deleted.

Why the driver: per-file merges from tasks conflict with each other (a conflict throws a whole merge
away, and one instance's task workers already collide at 0.46 conflicts per commit) and each rewrites
the table's touched files; bench/README has the numbers.

A file the table refuses (`delta_schema`) is parked under SINK_PARKED_PATH when the policy is `park` and
the others are merged without it; under `fail` the service stops with nothing of the batch committed.
When delta-rs refuses a merge of several files as a whole, they are applied one at a time to find it.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import TypeVar

from sink_service.driver.delta_bad_values import DeltaBadValues
from sink_service.driver.delta_compactions import BackgroundCompactions
from sink_service.driver.metrics import SinkMetrics
from sink_service.driver.offset_commit import TP
from uploader.delta import DeltaFile, DeltaRefusal
from uploader.delta_changes import delta_target
from uploader.delta_settings import DeltaSettings
from uploader.delta_slices import arrow_bytes, pieces
from uploader.delta_staging import DeltaStagingSettings, DeltaStagingTarget, StagedFile
from uploader.directory import DirectorySettings
from uploader.errors import RetryableUploadError
from uploader.parking import ParkingTarget
from uploader.s3_settings import S3Settings
from uploader.target import FileMetadata

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class StagedUpload:
    """A file a task staged: where it is and what it holds."""

    location: str
    metadata: FileMetadata
    bytes: int
    decoded_bytes: int  # the Arrow bytes of its rows (the task's writer counts them): what a merge holds


class DeltaBatches:
    """The Delta target's `BatchCommit` (sink_service/driver/batch_commit.py)."""

    action = "merging into the Delta table"

    def __init__(self, settings: DeltaSettings, parked: DirectorySettings | S3Settings | None, scratch: Path,
                 max_bytes: int, metrics: SinkMetrics, bad_values: DeltaBadValues | None = None) -> None:
        """`parked`: where refused files go under SINK_REJECTED_FILE_POLICY=park; None under `fail`.
        `bad_values`: SINK_ERROR_POLICY for records a column cannot take; None refuses their whole file."""
        self.settings = settings
        self.target = delta_target(settings)  # the change log in change-log mode
        self.staging = DeltaStagingTarget(DeltaStagingSettings(settings))
        self.parking = ParkingTarget(self.target, parked) if parked is not None else None
        self.scratch = scratch / "delta-merge"  # downloads of files staged on S3
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.bad_values = bad_values
        self._leftovers: dict[TP, list[StagedFile]] = {}  # found at the query's start, not yet passed
        self._lock = threading.Lock()  # `clean` runs beside the batches (`start`)
        self.compactions = BackgroundCompactions(settings, scratch, metrics) if settings.change_log else None

    def resume_position(self, topic: str, partition: int) -> int | None:
        """The table's application transaction for the group: a group whose offsets expired resumes there."""
        return self.target.covered_to(topic, partition)

    def apply(self, rows: Iterable, commits: dict[TP, int]) -> list[StagedUpload]:
        """Apply the staged files the new commit positions cover; the files, to delete after the Kafka commit.

        Raises RetryableUploadError when a merge ran out of its retries (nothing may be committed; the
        replay re-stages and the table's transactions skip what it holds) and FatalUploadError for what a
        person must fix, a refused file under the `fail` policy included."""
        staged = covered_uploads(rows, commits)
        if self.compactions is not None:
            self.compactions.check()
            self.compactions.appended([upload.metadata for upload in staged])
        if self.bad_values is not None:
            self.bad_values.new_batch()
        for group in merge_groups(staged, self.settings, self.max_bytes):
            self._apply(group)
        return staged

    def release(self, staged: list[StagedUpload], commits: dict[TP, int]) -> None:
        """Once Kafka holds the offsets: delete the batch's merged files, and the leftovers found at the query's
        start that the commits now pass (staged by a batch that failed or crashed, under other boundaries)."""
        done: dict[str, list[str]] = defaultdict(list)
        for upload in staged:
            done[upload.metadata.topic].append(upload.location)
        with self._lock:
            for tp, position in commits.items():
                passed = [s for s in self._leftovers.get(tp, []) if s.last_offset < position]
                if passed:
                    done[tp[0]] += [s.location for s in passed]
                    self._leftovers[tp] = [s for s in self._leftovers[tp] if s.last_offset >= position]
        for topic, locations in done.items():
            try:
                self.staging.area(topic).delete(locations)
            except Exception as exc:  # never fails a batch: the data is in the table and in Kafka's commit
                log.warning("could not delete %d staged file(s) of topic %s (deleted at the next start): %s",
                            len(locations), topic, exc)
        if self.compactions is not None:
            self.compactions.wake()

    def close(self, timeout_s: float) -> None:
        """At shutdown: end the background compactions (change-log mode)."""
        if self.compactions is not None:
            self.compactions.stop(timeout_s)

    def start(self, positions: dict[TP, int]) -> threading.Thread:
        """`clean` in the background: a store that does not answer keeps delta-rs retrying for minutes, which
        must not hold up the query's start (or a SIGTERM meanwhile); the batches' merges meet the outage anyway."""
        with self._lock:
            self._leftovers = {}
        if self.compactions is not None:
            self.compactions.known({topic for topic, _ in positions})
        thread = threading.Thread(target=self.clean, args=(positions,), name="delta-staging-clean", daemon=True)
        thread.start()
        return thread

    def clean(self, positions: dict[TP, int]) -> None:
        """Delete staged files the table or Kafka's commit already passed, and remember the others (a crashed
        batch's, which this query stages again, maybe cut differently) for `release`. Never deletes a file a
        merge still needs: those start at or after the positions, which only grow."""
        for (topic, partition), position in sorted(positions.items()):
            try:
                covered = max(position, self.target.covered_to(topic, partition) or 0)
                area = self.staging.area(topic)
                listed = area.listed(topic, partition)
                done = [s.location for s in listed if s.last_offset < covered]
                with self._lock:
                    self._leftovers[(topic, partition)] = [s for s in listed if s.last_offset >= covered]
                if done:
                    area.delete(done)
                    log.info("topic=%s partition=%d: deleted %d staged file(s) below offset %d", topic, partition,
                             len(done), covered)
            except Exception as exc:  # the store is down: the start must not wait on it partition by partition
                log.warning("could not clean staged files (topic=%s partition=%d; tried again at the next start): "
                            "%s", topic, partition, exc)
                return

    def _apply(self, group: list[StagedUpload]) -> None:
        """Each staged file downloaded once for the group, however many merges finding a refused file takes;
        a file larger than the memory bound is merged in pieces of whole row groups (uploader.delta_slices)."""
        try:
            files = [DeltaFile(self._local(upload), upload.metadata) for upload in group]
            cut = [piece for file in files for piece in pieces(file, self.max_bytes)]
            if len(cut) == len(files):
                self._merge(files)
                return
            by_partition: dict[TP, list[DeltaFile]] = defaultdict(list)
            for piece in cut:
                by_partition[(piece.metadata.topic, piece.metadata.partition)].append(piece)
            for merge in in_turns(by_partition, arrow_bytes, self.max_bytes):
                self._merge(merge)
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _merge(self, files: list[DeltaFile]) -> None:
        started = time.monotonic()
        try:
            details, attempts = self.target.merge(files, on_retry=self._count_retry, on_bad_values=self.bad_values)
        except DeltaRefusal as refusal:
            if len(refusal.files) > 1:  # delta-rs refused the merge as a whole: find the file one by one
                for file in files:
                    self._merge([file])
                return
            if self.parking is None:
                raise
            refused = refusal.files[0]
            self._park(next(f for f in files if f.metadata == refused), refusal)
            rest = [file for file in files if file.metadata != refused]
            if rest:
                self._merge(rest)
            return
        duration = time.monotonic() - started
        self.metrics.delta_merge_duration.observe(duration)
        self.metrics.record_delta_maintenance(details.get("maintenance") or {})
        applied = details.get("applied", [])
        log.info("merged %d staged file(s) (%d skipped as held already) into %s as version %s in %.2fs, "
                 "%d attempt(s): %s", len(applied), len(details.get("skipped_files", [])),
                 self.settings.uri_for(files[0].metadata.topic), details.get("version"), duration, attempts,
                 {k: v for k, v in details.items() if k.startswith("num_")} or "nothing changed",
                 extra={"fields": {"event": "delta_merge", "files": len(applied), "version": details.get("version"),
                                   "attempts": attempts, "duration_s": round(duration, 3)}})

    def _local(self, upload: StagedUpload) -> Path:
        try:
            return self.staging.area(upload.metadata.topic).local_copy(upload.location, self.scratch)
        except FileNotFoundError as exc:  # another member merged it and deleted it; the replay re-stages
            raise RetryableUploadError(f"staged file {upload.location} is gone: {exc}", reason="delta_staging") from exc

    def _park(self, file: DeltaFile, refusal: DeltaRefusal) -> None:
        assert self.parking is not None
        receipt = self.parking.park(file.path, file.metadata, refusal)
        self.metrics.parked_files.labels(file.metadata.topic, refusal.reason).inc()
        m = file.metadata
        log.error("file rejected and parked topic=%s partition=%d offsets=%d-%d reason=%s parked_at=%s: %s",
                  m.topic, m.partition, m.first_offset, m.last_offset, refusal.reason, receipt.location, refusal)

    def _count_retry(self, error: RetryableUploadError, _attempt: int, _wait_s: float) -> None:
        self.metrics.upload_retries.labels(error.reason).inc()  # uploader.retry logs each attempt


def covered_uploads(rows: Iterable, commits: dict[TP, int]) -> list[StagedUpload]:
    """The staged files below each partition's new commit position, per partition in offset order."""
    staged = []
    for row in rows:
        end = commits.get((row.topic, row.partition))
        if end is None:
            continue
        for upload in json.loads(row.files):
            if upload.get("parked") or upload["last_offset"] >= end:
                continue
            staged.append(StagedUpload(upload["location"], FileMetadata(
                topic=row.topic, partition=row.partition, first_offset=upload["first_offset"],
                last_offset=upload["last_offset"], record_count=upload["records"], target_table="",
                primary_keys=tuple(upload["primary_keys"]), order_column=upload["order_column"],
                schema_fingerprint=upload["schema_fingerprint"]), upload["bytes"],
                upload.get("decoded_bytes") or upload["bytes"]))
    return sorted(staged, key=lambda s: (s.metadata.topic, s.metadata.partition, s.metadata.first_offset))


def merge_groups(staged: list[StagedUpload], settings: DeltaSettings, max_bytes: int) -> list[list[StagedUpload]]:
    """One merge per table and key definition, cut where its rows would pass `max_bytes` (Arrow bytes)."""
    tables: dict[tuple, dict[TP, list[StagedUpload]]] = defaultdict(lambda: defaultdict(list))
    for upload in staged:
        m = upload.metadata
        tables[(settings.uri_for(m.topic), m.primary_keys, m.order_column)][(m.topic, m.partition)].append(upload)
    return [group for partitions in tables.values()
            for group in in_turns(partitions, lambda upload: upload.decoded_bytes, max_bytes)]


def in_turns(partitions: Mapping[TP, list[T]], size: Callable[[T], int], max_bytes: int) -> list[list[T]]:
    """The partitions' files in merges of at most `max_bytes` (a file alone may pass it), taken in turns
    across partitions, so each partition's files stay in offset order across the cuts."""
    groups: list[list[T]] = []
    group: list[T] = []
    total = 0
    for turn in zip_longest(*partitions.values()):
        for item in turn:
            if item is None:
                continue
            item_size = size(item)
            if group and total + item_size > max_bytes:
                groups.append(group)
                group, total = [], 0
            group.append(item)
            total += item_size
    if group:
        groups.append(group)
    return groups
