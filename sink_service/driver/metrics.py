"""Prometheus metrics, all recorded on the driver from task outcomes and Kafka offsets.

Executors report what they did in each range's outcome row, so counters stay correct on a
cluster without a push gateway: the driver is the single place that counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

TP = tuple[str, int]
_TP = ("topic", "partition")


MAINTENANCE_STEPS = ("compact", "cleanup_metadata", "vacuum")  # uploader/delta_maintenance.py's report keys

class ProcessTreeCollector(Collector):
    """Resident memory of this process and every process it started (the JVM, Spark's Python workers).

    `process_resident_memory_bytes` is the driver's Python process alone, a tenth of the service's
    memory; the documented memory bound (README, *Memory*) is for the whole tree, which is what a
    container's limit kills. Read from /proc at each scrape (a few ms); nothing where there is no /proc.
    """

    def __init__(self, proc: str = "/proc", pid: int | None = None) -> None:
        self._proc = Path(proc)
        self._pid = pid or os.getpid()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def tree(self) -> dict[int, int]:
        """pid -> resident bytes for this process and its descendants."""
        parents: dict[int, int] = {}
        rss: dict[int, int] = {}
        for entry in self._proc.iterdir() if self._proc.is_dir() else ():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # the process ended meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
            pid = int(entry.name)
            parents[pid], rss[pid] = int(fields[1]), int(fields[21]) * self._page
        children: dict[int, list[int]] = {}
        for pid, ppid in parents.items():
            children.setdefault(ppid, []).append(pid)
        members, frontier = {self._pid}, [self._pid]
        while frontier:
            found = [pid for pid in children.get(frontier.pop(), ()) if pid not in members]
            members.update(found)
            frontier.extend(found)
        return {pid: rss[pid] for pid in members if pid in rss}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tree = self.tree()
        if not tree:
            return
        yield GaugeMetricFamily(
            "sink_process_tree_resident_memory_bytes", "Resident memory of the service's processes summed: the "
            "driver, the JVM and Spark's Python workers (what the documented memory bound is about).",
            value=sum(tree.values()))
        yield GaugeMetricFamily(
            "sink_process_tree_processes", "Processes in the service's tree (driver, JVM, Python workers).",
            value=len(tree))


class StagingDeleteFailuresCollector(Collector):
    """Staged Delta files the driver could not delete, by reason (uploader.delta_staging counts them where
    they happen, which knows no registry; read at each scrape)."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        from uploader.delta_staging import delete_failures

        family = CounterMetricFamily(
            "sink_delta_staging_delete_failures", "Staged Delta files that could not be deleted after their merge, "
            "by reason (an S3 error code such as AccessDenied: grant s3:DeleteObject under the table).",
            labels=("reason",))
        for reason, count in sorted(delete_failures().items()):
            family.add_metric((reason,), count)
        yield family


class SinkMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # process_* (the driver's CPU, memory, open files, start time), python_info and python_gc_*:
        # a registry of its own has none of the default registry's collectors unless they are added.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        r.register(ProcessTreeCollector())
        r.register(StagingDeleteFailuresCollector())
        self._assigned: set[TP] = set()  # partitions with an assignment time
        self._repeating: set[TP] = set()
        self._reported: set[TP] = set()  # partitions with per-partition gauges
        self.records_read = Counter("sink_records_read_total", "Kafka records read by tasks.", _TP, registry=r)
        self.records_written = Counter(
            "sink_records_written_total", "Records written into Parquet files.", _TP, registry=r)
        self.records_uploaded = Counter(
            "sink_records_uploaded_total", "Records in files the target accepted.", _TP, registry=r)
        self.records_filtered = Counter(
            "sink_records_filtered_total", "Records SINK_TRANSFORM_SQL's WHERE left out (committed, not written).",
            _TP, registry=r)
        self.files_uploaded = Counter("sink_files_uploaded_total", "Files the target accepted.", _TP, registry=r)
        self.bytes_uploaded = Counter(
            "sink_uploaded_bytes_total", "Parquet bytes the target accepted.", _TP, registry=r)
        self.upload_duration = Histogram(
            "sink_upload_duration_seconds", "Time to upload one file, retries included.", ("target",),
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.upload_retries = Counter(
            "sink_upload_retries_total", "Upload attempts that were retried, by reason.", ("reason",), registry=r)
        self.upload_failures = Counter(
            "sink_upload_failures_total", "Ranges that stopped on an upload error, by class (retryable, fatal).",
            ("class",), registry=r)
        self.parked_files = Counter(
            "sink_parked_files_total", "Files the endpoint rejected as bad content, parked under "
            "SINK_PARKED_PATH, by reason (http_400, http_413).", ("topic", "reason"), registry=r)
        self.delta_merge_duration = Histogram(
            "sink_delta_merge_duration_seconds", "Time the driver took to merge one commit's staged files into "
            "the Delta table, retries included (SINK_TARGET=delta).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.delta_compactions = Counter(
            "sink_delta_compactions_total", "Change-log mode (SINK_DELTA_CHANGE_LOG): compactions of the change log "
            "into the keyed Delta table, by result (ok; retry: failed, tried again after the next batch; fatal).",
            ("result",), registry=r)
        self.delta_compaction_duration = Histogram(
            "sink_delta_compaction_duration_seconds", "Change-log mode: time one compaction of the change log into the "
            "keyed Delta table took, all buckets and retries included.",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600), registry=r)
        self.delta_maintenance = Counter(
            "sink_delta_maintenance_total", "Delta table maintenance steps run after a merge (compact, "
            "cleanup_metadata, vacuum), by result (ok, failed: retried at the next due version).",
            ("step", "result"), registry=r)
        self.bad_records = Counter(
            "sink_bad_records_total", "Records that could not become rows, by reason.", ("topic", "reason"),
            registry=r)
        self.dead_letters = Counter(
            "sink_dead_letters_total", "Bad records the dead-letter topic (SINK_DLQ_TOPIC) acknowledged, by "
            "source topic and reason; a replayed range sends its dead letters again.", ("topic", "reason"),
            registry=r)
        self.lag = Gauge(
            "sink_consumer_lag_records",
            "Last stable offset minus the committed offset (before the first commit: minus the start position).",
            _TP, registry=r)
        self.pending_records = Gauge(
            "sink_pending_records", "Records available but not yet admitted for writing.", _TP, registry=r)
        self.pending_age = Gauge(
            "sink_oldest_pending_record_age_seconds", "How long the oldest pending record has waited.", _TP,
            registry=r)
        self.batch_duration = Histogram(
            "sink_microbatch_duration_seconds", "Wall time of one micro-batch (read, write, upload, commit).",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300), registry=r)
        self.batches = Counter("sink_microbatches_total", "Micro-batches by result.", ("result",), registry=r)
        self.last_commit = Gauge(
            "sink_last_commit_timestamp_seconds", "Unix time of the last successful commit.", _TP, registry=r)
        self.assigned_at = Gauge(
            "sink_partition_assigned_timestamp_seconds", "Unix time this instance was assigned the partition "
            "(kept across replays): until its first commit, the no-commit alert counts from here.", _TP, registry=r)
        self.ready = Gauge("sink_ready", "1 while /readyz answers 200.", registry=r)
        self.build_info = Info("sink_build", "Versions of the service, Spark and librdkafka.", registry=r)
        self.committed_offset = Gauge(
            "sink_committed_offset", "Offset committed to the consumer group.", _TP, registry=r)
        self.oldest_upload_age = Gauge(
            "sink_upload_oldest_inflight_age_seconds",
            "Age of the oldest upload in flight, from the executors' live signals; 0 when none.", registry=r)
        self.assigned_partitions = Gauge(
            "sink_assigned_partitions", "Partitions the consumer group assigned to this instance; 0 on a "
            "standby (more instances than partitions).", registry=r)
        self.started_without_commit = Counter(
            "sink_partitions_started_without_commit_total", "Partitions whose start without a committed "
            "offset this instance decided (at a new group's first start, every subscribed one), by topic and "
            "start (first_start: SINK_STARTING_OFFSETS, a new group or offsets "
            "expired after offsets.retention.minutes; found_later: earliest, a topic or partition created or "
            "matched later; table: a Delta table's position). On a group that has run before, an increase "
            "means its offsets expired or were deleted.", ("topic", "start"), registry=r)
        self.repeated_failures = Gauge(
            "sink_repeated_failures", "Replays in a row that failed at the same offset with the same "
            "error (not outages); the service stops at SINK_MAX_IDENTICAL_FAILURES.", _TP, registry=r)

    def record_fresh_starts(self, starts: Iterable[Any]) -> None:
        """Partitions started without a committed offset (`kafka_source.offsets.FreshStart`)."""
        for start in starts:
            self.started_without_commit.labels(start.tp[0], start.source).inc()

    def record_outcome(self, row, target: str, counted_live: Mapping[str, int]) -> None:
        labels = (row.topic, str(row.partition))
        self.records_read.labels(*labels).inc(row.records_read)
        self.records_written.labels(*labels).inc(row.records_written)
        self.records_uploaded.labels(*labels).inc(row.records_uploaded)
        self.records_filtered.labels(*labels).inc(row.records_filtered)
        for upload in json.loads(row.files):
            if upload["parked"]:
                self.parked_files.labels(row.topic, upload["parked"]).inc()
                continue
            self.files_uploaded.labels(*labels).inc()
            self.bytes_uploaded.labels(*labels).inc(upload["bytes"])
            self.upload_duration.labels(target).observe(upload["duration_s"])
        for reason, count in json.loads(row.retries).items():
            # Retries the live signals already counted while the task ran are not counted twice.
            self.upload_retries.labels(reason).inc(max(0, count - counted_live.get(reason, 0)))
        for reason, count in json.loads(row.bad_reasons).items():
            self.bad_records.labels(row.topic, reason).inc(count)
        for reason, count in json.loads(row.dead_letters).items():
            self.dead_letters.labels(row.topic, reason).inc(count)
        if row.failure_class:
            self.upload_failures.labels(row.failure_class).inc()

    def record_delta_maintenance(self, maintenance: Mapping[str, object]) -> None:
        """The steps a Delta merge's maintenance ran (uploader.delta_maintenance), by result."""
        for step, result in maintenance.items():
            if step in MAINTENANCE_STEPS:
                failed = isinstance(result, str) and result.startswith("failed")
                self.delta_maintenance.labels(step, "failed" if failed else "ok").inc()

    def record_commits(self, commits: Mapping[TP, int]) -> None:
        now = time.time()
        self._reported |= commits.keys()
        for (topic, partition), offset in commits.items():
            self.last_commit.labels(topic, str(partition)).set(now)
            self.committed_offset.labels(topic, str(partition)).set(offset)

    def record_repeated_failures(self, times: Mapping[TP, int]) -> None:
        for tp in self._repeating - times.keys():
            self.repeated_failures.labels(tp[0], str(tp[1])).set(0)
        self._reported |= times.keys()
        for (topic, partition), count in times.items():
            self.repeated_failures.labels(topic, str(partition)).set(count)
        self._repeating = set(times)

    def keep_partitions(self, assigned: frozenset[TP] | set[TP]) -> None:
        """Drop the per-partition gauges of partitions the group moved to another instance.

        Only a partition's current owner reports its lag, position and commit time, so sums across
        replicas stay right; the owner's own series survive a replay (the no-commit alert needs them).
        A newly assigned partition gets its assignment time, so that a partition that never commits
        (a restart straight into an endpoint outage) still has a series the no-commit alert can age.
        """
        gauges = (self.lag, self.pending_records, self.pending_age, self.last_commit, self.committed_offset,
                  self.repeated_failures, self.assigned_at)
        for topic, partition in (self._reported | self._assigned) - set(assigned):
            for gauge in gauges:
                with contextlib.suppress(KeyError):  # this partition never had that series
                    gauge.remove(topic, str(partition))
        self._reported &= set(assigned)
        now = time.time()
        for topic, partition in set(assigned) - self._assigned:
            self.assigned_at.labels(topic, str(partition)).set(now)
        self._assigned = set(assigned)

    def record_lag(self, committed: Mapping[TP, int], latest: Mapping[TP, int]) -> None:
        for tp, end in latest.items():
            if tp in committed:
                self._reported.add(tp)
                self.lag.labels(tp[0], str(tp[1])).set(max(0, end - committed[tp]))

    def record_admission(self, state_path: Path) -> None:
        """Pending records and ages as the planner last saw them (it runs in another process)."""
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError):
            return
        now = time.time()
        for key, (pending, since) in state.get("partitions", {}).items():
            topic, _, partition = key.rpartition(":")
            self._reported.add((topic, int(partition)))
            self.pending_records.labels(topic, partition).set(pending)
            self.pending_age.labels(topic, partition).set(max(0.0, now - since) if pending and since else 0.0)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
