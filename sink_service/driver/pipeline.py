"""Driver side: the streaming query, and what happens after each micro-batch.

Each micro-batch maps every admitted offset range through `process_range` on the executors,
collects one small outcome row per range, commits contiguous progress to the consumer group,
and fails the batch (so the query is replayed from the committed offsets) if any range did not
finish. Spark's checkpoint is scratch: every query starts from the offsets committed in Kafka.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from confluent_kafka import KafkaException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from sink_service.config import SinkConfig
from sink_service.driver.backlog import BacklogProgress
from sink_service.driver.batch_commit import batch_commit
from sink_service.driver.health import Health
from sink_service.driver.live_uploads import LiveUploads
from sink_service.driver.metrics import SinkMetrics
from sink_service.driver.offset_commit import ContiguousCommits, RangeOutcome
from sink_service.driver.repeated_failures import Failure, RepeatedFailures, Streak
from sink_service.kafka_source.datasource import (
    FORMAT_NAME,
    PENDING_STATE_FILE,
    SourceOptions,
)
from sink_service.kafka_source.membership import CommitRefused, GroupMembership
from sink_service.kafka_source.offsets import KafkaOffsets, Subscription
from sink_service.kafka_source.planner_hints import PlannerHints
from sink_service.kafka_source.positions import nest
from sink_service.task.outcomes import ERROR_PROCESSING, RESULT_SCHEMA_DDL, STATUS_FATAL, STATUS_OK, STATUS_RETRYABLE
from sink_service.task.recipe import TaskRecipe
from sink_service.task.upload_signals import NO_SIGNALS, SignalChannel, signal_url
from uploader.errors import FatalUploadError, RetryableUploadError

log = logging.getLogger(__name__)

BROKER_ANSWER_S = 5.0  # a broker check without an answer for this long marks the broker unreachable
ASSIGNMENT_WAIT_S = 60.0  # joining the group takes a few seconds; longer means the broker is not answering


class BatchIncomplete(Exception):
    """Some range did not finish; the query is replayed from the committed offsets."""


class FatalPipelineError(Exception):
    """Retrying cannot fix this; the service stops with a non-zero exit."""


class Pipeline:
    def __init__(self, config: SinkConfig, spark: SparkSession, health: Health, metrics: SinkMetrics,
                 live_uploads: LiveUploads, membership: GroupMembership, batch_running: threading.Event):
        self.config = config
        self.live_uploads = live_uploads
        self.metrics = metrics
        self.spark = spark
        self.health = health
        self.client_config = config.kafka_client_config()
        self.kafka = KafkaOffsets(self.client_config, config.group_id)
        self.stopping = threading.Event()
        self.membership = membership  # joined by the service while the JVM started
        self.batch_running = batch_running  # set while a micro-batch runs: a rebalance waits for it
        self._epoch = -1  # the membership epoch the running query was planned at
        self.fatal_error: str | None = None
        self.failure = ""  # why the last micro-batch of this query failed, for readiness
        self._commits: ContiguousCommits | None = None
        self._repeated = RepeatedFailures(config.max_identical_failures)
        self._backlog = BacklogProgress(caught_up_records=config.flush_records)  # the 30 s catch-up line
        scratch = Path(config.scratch_dir)
        self.state_dir = scratch / "state"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._hints = PlannerHints()
        signals = NO_SIGNALS
        if config.http_port:
            # Executors reach the driver where Spark does; local executors run in this process.
            host = "127.0.0.1" if config.spark_master.startswith("local") else spark.conf.get("spark.driver.host")
            signals = SignalChannel(signal_url(config.http_host, config.http_port, host), live_uploads.token)
        # Plain configuration: each executor builds its decoders and target from it (task/recipe.py).
        self.task_recipe = TaskRecipe.of(config, self.client_config, signals)

        self.batch_commit = batch_commit(config, self.metrics, self.task_recipe, self.client_config)

    def close(self) -> None:
        """After the query stopped: background work (change-log compactions) ends within the shutdown timeout."""
        self.batch_commit.close(self.config.shutdown_timeout_ms / 1000)

    def assignment_changed(self) -> bool:
        """The group moved partitions since the query started: it must restart on the new ones."""
        return self.membership.epoch != self._epoch

    def start_query(self) -> StreamingQuery:
        """Plan the partitions the group assigned, from its committed offsets (checked against retention)."""
        c = self.config
        settled = self.membership.wait_assignment(ASSIGNMENT_WAIT_S, stop=self.stopping)
        if settled is None:
            raise KafkaException(f"consumer group {c.group_id} assigned no partitions within {ASSIGNMENT_WAIT_S:.0f}s")
        assigned, self._epoch = settled
        tps = sorted(assigned)
        self._commits = None  # the old assignment's positions: no longer reported (refresh_offset_metrics)
        self.metrics.keep_partitions(assigned)  # partitions now owned elsewhere report there
        (self.state_dir / PENDING_STATE_FILE).unlink(missing_ok=True)
        try:
            positions = self.kafka.resolve_start(
                tps, c.starting_offsets, c.retention_gap_policy,
                commit=lambda resolved: self.membership.commit(resolved, self._epoch),
                subscription=Subscription(c.topics, c.topic_pattern),
                # A group whose offsets expired resumes where the Delta table's transactions say.
                table_position=self.batch_commit.resume_position,
                commit_first_start=lambda resolved: self.membership.commit(resolved, self._epoch, others=True),
                on_fresh=self.metrics.record_fresh_starts)
        except CommitRefused as exc:
            raise KafkaException(f"start positions not committed, the group is rebalancing: {exc}") from exc
        self.health.update(broker_ok=True)
        self.batch_commit.start(positions)
        self._commits = ContiguousCommits(positions)
        log.info("starting query at %s", {f"{t}:{p}": o for (t, p), o in sorted(positions.items())})
        self.live_uploads.clear()  # tasks of an earlier query are gone, whatever they last said
        self.failure = ""
        checkpoint = Path(c.scratch_dir) / "checkpoints" / uuid.uuid4().hex
        shutil.rmtree(checkpoint.parent, ignore_errors=True)
        options = SourceOptions(
            client_config=self.client_config,
            group_id=c.group_id,
            starting_positions=nest(positions),
            flush_records=c.flush_records,
            flush_bytes=c.flush_bytes,
            flush_interval_ms=c.flush_interval_ms,
            max_files_per_batch=c.max_files_per_batch,
            max_batch_records=c.max_batch_records,
            executor_cores=self.spark.sparkContext.defaultParallelism,
            retention_gap_policy=c.retention_gap_policy,
            read_batch_max_bytes=c.read_batch_max_bytes,
            state_dir=str(self.state_dir),
            task=SourceOptions.pack_task(self.task_recipe),
            logging=asdict(self.task_recipe.logging) if self.task_recipe.logging else None,
        )
        stream = (
            self.spark.readStream.format(FORMAT_NAME)
            .schema(RESULT_SCHEMA_DDL)  # given, so the source's planning process need not import the task code
            # The key contains "secret" so that Spark redacts the value (it holds Kafka
            # credentials) wherever it prints options.
            .option("secret_config", options.to_option())
            .load()
        )
        query = (
            stream.writeStream.foreachBatch(self._on_batch)
            .trigger(processingTime=f"{c.poll_interval_ms} milliseconds")
            .option("checkpointLocation", str(checkpoint))
            .queryName("kafka-parquet-sink")
            .start()
        )
        log.info("streaming query %s started", query.id)
        return query

    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        if self.stopping.is_set():
            return  # shutting down: admit nothing new; Kafka still holds it
        self.batch_running.set()  # before the ownership check: a rebalance waits for it, or is seen here
        if not self.membership.owns(self._epoch):
            self.batch_running.clear()
            return  # the partitions are moving: the query restarts on the new assignment
        started = time.monotonic()
        result = "failed"
        try:
            rows = batch.collect()  # one small outcome row per offset range
            self._settle(batch_id, rows, time.monotonic() - started)
            result = "ok"
        finally:
            self.batch_running.clear()
            self.metrics.batch_duration.observe(time.monotonic() - started)
            self.metrics.batches.labels(result).inc()

    def _settle(self, batch_id: int, rows: list, duration_s: float) -> None:
        outcomes = [
            RangeOutcome(r.topic, r.partition, r.range_start, r.range_end, r.committable, r.status)
            for r in rows
        ]
        moved = self._moved_elsewhere({o.tp for o in outcomes})
        commits, gaps = self._commits.advance([o for o in outcomes if o.tp not in moved])
        applied = self._apply_to_target(batch_id, rows, commits)
        try:
            self.membership.commit(commits, self._epoch)
        except CommitRefused as exc:
            log.warning("batch %d: commit refused, the partitions moved to another member (%s); "
                        "restarting on the new assignment", batch_id, exc)
            raise BatchIncomplete(f"commit refused: {exc}") from exc
        self.metrics.record_commits(commits)
        self.batch_commit.release(applied, commits)
        if commits:
            self.health.update(last_commit_at=time.time())
        records = sum(r.records_uploaded for r in rows)
        for row in rows:
            self._report_range(row)
        log.info(
            "batch %d: %d range(s), %d record(s) uploaded, committed %s in %.2fs",
            batch_id, len(rows), records,
            {f"{t}:{p}": o for (t, p), o in sorted(commits.items())} or "nothing", duration_s,
        )
        self._hints.save(self.state_dir)
        failed = [r for r in rows if r.status != STATUS_OK]
        fatal = [r for r in failed if r.status == STATUS_FATAL]
        if fatal:
            self.fatal_error = fatal[0].error
            raise FatalPipelineError(self.fatal_error)
        exhausted = self._count_repeats(rows, failed)
        if exhausted:
            self.fatal_error = (
                f"{exhausted.describe()}. Replaying cannot fix this (SINK_MAX_IDENTICAL_FAILURES="
                f"{self.config.max_identical_failures}); nothing past offset {exhausted.failure.offset} was "
                "committed. Fix the cause and restart; the service resumes there."
            )
            raise FatalPipelineError(self.fatal_error)
        if moved:
            raise BatchIncomplete(
                "committed offsets moved outside this service (an offset reset with Kafka tooling?): "
                + "; ".join(f"topic={t} partition={p}: {was} -> {now}" for (t, p), (was, now) in sorted(moved.items()))
                + "; restarting from them"
            )
        if failed or gaps:
            reasons = [f"{r.topic}:{r.partition} [{r.range_start},{r.range_end}): {r.error}" for r in failed]
            repeats = [s.describe() for s in self._repeated.streaks.values() if s.times > 1]
            self.failure = f"batch {batch_id} failed: {repeats or reasons or gaps}"
            self.health.update(last_batch_ok=False, reason=self.failure)
            raise BatchIncomplete("; ".join(reasons + gaps))
        self.health.update(last_batch_ok=True, reason="")

    def _apply_to_target(self, batch_id: int, rows: list, commits: dict) -> list:
        """Before Kafka's commit: the target's part of the batch (a Delta target merges the files it covers).

        A failure fails the batch before anything is committed; the query restarts from Kafka's offsets."""
        if not commits:
            return []
        action = self.batch_commit.action
        try:
            return self.batch_commit.apply(rows, commits)
        except RetryableUploadError as exc:
            self.failure = f"batch {batch_id}: {action} failed: {exc}"
            self.health.update(last_batch_ok=False, reason=self.failure)
            self.metrics.upload_failures.labels(STATUS_RETRYABLE).inc()
            log.error("batch %d: %s; nothing committed, replaying", batch_id, self.failure)
            raise BatchIncomplete(self.failure) from exc
        except FatalUploadError as exc:
            self.fatal_error = f"{action}: {exc}"
            self.metrics.upload_failures.labels(STATUS_FATAL).inc()
            raise FatalPipelineError(self.fatal_error) from exc

    def _moved_elsewhere(self, tps: set[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """Partitions whose committed offset differs from the one this service last committed.

        A broker that enforces group membership refuses an offset reset from Kafka tooling while
        this member is active; one that accepts it (noida-db) gets it followed (the query restarts
        from it), never overwritten by this service's next commit.
        """
        committed = self.kafka.committed(tps)
        positions = self._commits.positions
        moved = {tp: (positions[tp], committed[tp]) for tp in tps
                 if tp in committed and tp in positions and committed[tp] != positions[tp]}
        for (topic, partition), (was, now) in sorted(moved.items()):
            log.warning("topic=%s partition=%d: committed offset moved from %d to %d outside this service; "
                        "following it (nothing committed over it)", topic, partition, was, now)
        return moved

    def _count_repeats(self, rows: list, failed: list) -> Streak | None:
        """Track failures that repeat at one offset; return a streak that reached the limit."""
        failures = [
            Failure(r.topic, r.partition, r.committable, r.error, counts=r.error_kind == ERROR_PROCESSING)
            for r in failed
        ]
        finished = [(r.topic, r.partition) for r in rows if r.status == STATUS_OK]
        exhausted = self._repeated.observe(finished, failures)
        self.metrics.record_repeated_failures({tp: s.times for tp, s in self._repeated.streaks.items()})
        return exhausted[0] if exhausted else None

    def refresh_offset_metrics(self) -> None:
        """Lag and pending records, also while no batch runs; doubles as the broker check."""
        commits = self._commits
        tps = list(commits.positions) if commits else []
        # A paused or black-holed broker does not refuse, it never answers: the client waits out
        # its 30 s timeout. Readiness must show that within BROKER_ANSWER_S, not when it ends.
        silent = threading.Timer(BROKER_ANSWER_S, self.health.update, kwargs={
            "broker_ok": False, "reason": f"broker unreachable: no answer within {BROKER_ANSWER_S:.0f}s"})
        silent.daemon = True
        silent.start()
        try:
            latest = self.kafka.latest(tps)
            committed = self.kafka.committed(tps)
        except Exception as exc:  # any client error means: not reachable right now
            self.health.update(broker_ok=False, reason=f"broker unreachable: {exc}")
            return
        finally:
            silent.cancel()
            silent.join()  # it either never ran or is done: the answer below has the last word
        self.health.update(broker_ok=True)
        if self._commits is not commits:
            # The query restarted on another assignment while we asked: these are partitions this
            # instance may no longer own, and their gauges were just dropped (a standby showed lag).
            return
        # Where nothing is committed yet, lag counts from the resolved start position: a fresh
        # deployment facing a backlog, or an endpoint down from the start, must show lag at once.
        positions = {**commits.positions, **committed} if commits else committed
        self.metrics.record_lag(positions, latest)
        self._backlog.report(time.monotonic(), positions, latest)
        self.metrics.record_admission(self.state_dir / PENDING_STATE_FILE)

    def _report_range(self, row) -> None:
        counted_live = self.live_uploads.task_ended((row.topic, row.partition, row.range_start))
        self.metrics.record_outcome(row, self.config.target, counted_live)
        self._hints.learn_types(row.topic, row.written_schema)
        for upload in json.loads(row.files):
            self._hints.learn_size(row.topic, upload["bytes"], upload["records"])
            if upload.get("parked"):
                continue  # logged at ERROR by the task that parked it; it was not uploaded
            fields = {
                "event": "upload", "topic": row.topic, "partition": row.partition,
                "first_offset": upload["first_offset"], "last_offset": upload["last_offset"],
                "rows": upload["records"], "bytes": upload["bytes"], "duration_s": upload["duration_s"],
                "attempts": upload["attempts"], "target": self.config.target,
                "response_id": upload["response_id"], "file": upload["file"],
            }
            log.info(
                "uploaded topic=%s partition=%d offsets=%d-%d rows=%d bytes=%d duration=%.3fs "
                "attempts=%d target=%s id=%s",
                row.topic, row.partition, upload["first_offset"], upload["last_offset"],
                upload["records"], upload["bytes"], upload["duration_s"], upload["attempts"],
                self.config.target, upload["response_id"], extra={"fields": fields},
            )
        if row.bad_records:
            log.warning(
                "topic=%s partition=%d: %d bad record(s) %s (SINK_ERROR_POLICY=%s): %s",
                row.topic, row.partition, row.bad_records,
                {"skip": "skipped", "dlq": f"sent to {self.config.dlq_topic}"}.get(self.config.error_policy, "found"),
                self.config.error_policy, "; ".join(json.loads(row.bad_samples)),
            )
        if row.status != STATUS_OK:
            log.error("topic=%s partition=%d range [%d,%d) stopped at %d: %s", row.topic, row.partition,
                      row.range_start, row.range_end, row.committable, row.error)
