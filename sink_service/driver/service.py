"""Service lifecycle: start, replay failed batches with backoff, drain on SIGTERM, exit codes.

Exit codes: 0 after a clean stop, 2 for configuration errors, 3 when retrying cannot help (bad
credentials, a bad record under SINK_ERROR_POLICY=fail, a retention gap under the default
policy). Everything else is retried from the committed offsets while the process stays up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import secrets
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException
from pyspark.errors import StreamingQueryException

from sink_service.config import SinkConfig
from sink_service.driver.health import Health, HealthServer, SignalEndpoint
from sink_service.driver.live_uploads import LiveUploads
from sink_service.driver.metrics import SinkMetrics
from sink_service.driver.scratch import ScratchError, claim_scratch
from sink_service.kafka_source.membership import GroupMembership, instance_id
from sink_service.kafka_source.positions import OffsetGapError
from sink_service.shared.kafka_access import KafkaAccessRefused
from sink_service.startup.spark_session import start_spark
from sink_service.startup.stop_signals import release_stop_signals, stop_signals_held
from sink_service.task.upload_signals import SIGNAL_PATH

if TYPE_CHECKING:
    from sink_service.driver.pipeline import Pipeline

log = logging.getLogger("sink_service")

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_FATAL = 3
OFFSET_MONITOR_INTERVAL_S = 5.0
REVOKE_WAIT_S = 120.0  # a rebalance waits this long for the batch in flight to upload and commit


class SinkService:
    def __init__(self, config: SinkConfig, versions: dict[str, str] | None = None):
        self.config = config
        self.health = Health()
        self.metrics = SinkMetrics()
        self.metrics.build_info.info(versions or {})
        self.live_uploads = LiveUploads(secrets.token_hex(16))
        self.health.uploads_failing = self.live_uploads.failing
        self._stop_requested = threading.Event()
        self._pipeline: Pipeline | None = None

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        if not self._stop_requested.is_set():
            log.info("stop requested (%s): no new data is admitted", signal.Signals(signum).name if signum else "api")
        self._stop_requested.set()
        self.health.update(stopping=True, reason="shutting down")
        if self._pipeline is not None:
            self._pipeline.stopping.set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        release_stop_signals()  # one held since the process started (`__main__`) is handled here
        try:
            scratch = claim_scratch(Path(self.config.scratch_dir))
        except ScratchError as exc:  # busy, unsafe (a link, another user's) or unusable
            log.error("%s", exc)
            return EXIT_CONFIG
        log.info("scratch area %s (SINK_SCRATCH_DIR=%s)", scratch.path, self.config.scratch_dir)
        self.config = dataclasses.replace(self.config, scratch_dir=str(scratch.path))
        server = None
        if self.config.http_port:
            try:
                server = HealthServer(self.health, self.config.http_port, self._metrics_exposition,
                                      signals=SignalEndpoint(SIGNAL_PATH, self.live_uploads.token,
                                                             self._receive_signal),
                                      host=self.config.http_host)
            except OSError as exc:  # a port in use, an address this host does not have
                log.error("cannot serve HTTP on %s port %d: %s (check SINK_HTTP_HOST and SINK_HTTP_PORT)",
                          self.config.http_host, self.config.http_port, exc)
                scratch.release()
                return EXIT_CONFIG
            server.start()
            log.info("HTTP endpoints on port %d (%s): /healthz /readyz /metrics", server.port, self.config.http_host)
        # The JVM starts on one core for seconds; the pipeline's imports (~0.5 s) take the other, and
        # the group join runs meanwhile too: a join makes the broker work for seconds (noida-db: a
        # core for 3-5 s on a backlog), which then overlaps the JVM's start, not the first batch.
        # Started with the stop signals held, so that no thread started here (nor any thread the
        # imports start) can take a SIGTERM while the main thread ignores it for the JVM's sake.
        batch_running = threading.Event()
        with stop_signals_held():
            threading.Thread(target=_import_quietly, args=("sink_service.driver.pipeline",), name="import-pipeline",
                             daemon=True).start()
            try:
                membership = self._join_group(batch_running)
            except KafkaAccessRefused as exc:  # librdkafka cannot make the client (a key that does not decrypt)
                log.error("stopping: %s", exc)
                scratch.release()
                if server is not None:
                    server.stop()
                return EXIT_FATAL
        spark = None
        try:
            spark = start_spark(self.config)
            from sink_service.driver.pipeline import Pipeline  # waits for the thread's import if still running

            self._pipeline = Pipeline(self.config, spark, self.health, self.metrics, self.live_uploads,
                                      membership, batch_running)
            monitor = threading.Thread(target=self._monitor_offsets, name="offset-monitor", daemon=True)
            monitor.start()
            if self._stop_requested.is_set():
                self._pipeline.stopping.set()
            return self._supervise(self._pipeline)
        finally:
            if self._pipeline is not None:
                self._pipeline.close()
            membership.close()  # after the drain: leave the group, partitions move at once
            if spark is not None:
                spark.stop()
            scratch.release()
            if server is not None:
                server.stop()
            log.info("stopped")

    def _join_group(self, batch_running: threading.Event) -> GroupMembership:
        """Start joining the consumer group; the pipeline plans only the partitions it assigns."""
        c = self.config
        membership = GroupMembership(
            c.kafka_client_config(), c.group_id,
            list(c.topics) if c.topics else [f"^({c.topic_pattern})$"],  # a full match
            c.topic_refresh_interval_ms, batch_idle=lambda: not batch_running.is_set(),
            revoke_wait_s=REVOKE_WAIT_S, instance_id=instance_id(c.scratch_dir),
            on_change=lambda assigned: self.metrics.assigned_partitions.set(len(assigned or ())))
        membership.start()
        return membership

    def _metrics_exposition(self) -> tuple[bytes, str]:
        self.metrics.ready.set(1 if self.health.readiness()[0] else 0)
        self.metrics.oldest_upload_age.set(self.live_uploads.oldest_age_s(time.time()))
        return self.metrics.exposition()

    def _receive_signal(self, body: bytes) -> int:
        """An executor's live upload signal: a retry counts at once, not when its task ends."""
        status, retry_reason = self.live_uploads.receive(body)
        if retry_reason is not None:
            self.metrics.upload_retries.labels(retry_reason).inc()
        return status

    def _monitor_offsets(self) -> None:
        while not self._stop_requested.wait(OFFSET_MONITOR_INTERVAL_S):
            self._pipeline.refresh_offset_metrics()

    def _supervise(self, pipeline: Pipeline) -> int:
        backoff_s = 1.0
        while not self._stop_requested.is_set():
            if pipeline.membership.failure is not None:  # it gave up its partitions: the query stopped
                log.error("stopping: %s", pipeline.membership.failure)
                return EXIT_FATAL
            try:
                query = pipeline.start_query()
            except OffsetGapError as exc:
                log.error("%s", exc)
                return EXIT_FATAL
            except KafkaException as exc:
                if self._stop_requested.is_set():
                    break  # stopped while waiting for the broker or the group: nothing was read
                if pipeline.membership.failure is not None:
                    continue  # not the broker: reported at the top of the loop
                self.health.update(broker_ok=False, reason=f"broker unreachable: {exc}")
                log.error("cannot reach Kafka: %s; retrying in %.0fs", exc, backoff_s)
                backoff_s = self._backoff(backoff_s)
                continue
            self.health.update(query_running=True)
            pipeline.refresh_offset_metrics()  # lag from the first moment, not after the monitor's first tick
            while query.isActive and not self._stop_requested.is_set() and not pipeline.assignment_changed():
                try:
                    query.awaitTermination(0.5)
                except StreamingQueryException:
                    break
                if self.health.last_batch_ok:
                    backoff_s = 1.0
            self.health.update(query_running=False)
            if self._stop_requested.is_set():
                return self._drain(pipeline, query)
            if pipeline.assignment_changed():
                # A revoke waited for the batch of the old assignment; a lost assignment did not, and
                # stopping cancels its tasks (Spark cancels the query's job group) so they stop uploading.
                query.stop()
                log.info("the group's assignment changed; restarting the query on it")
                continue
            if pipeline.fatal_error is not None:
                log.error("stopping: %s", pipeline.fatal_error)
                return EXIT_FATAL
            error = query.exception()
            # The pipeline's own account (which range, why) beats Spark's wrapped exception.
            self.health.update(last_batch_ok=False,
                               reason=pipeline.failure or f"micro-batch failed: {_first_line(error)}")
            log.error("micro-batch failed; replaying from the committed offsets in %.0fs: %s",
                      backoff_s, _summary(error))
            backoff_s = self._backoff(backoff_s)
        return EXIT_OK

    def _backoff(self, current_s: float) -> float:
        self._stop_requested.wait(current_s)
        return min(current_s * 2, self.config.restart_backoff_max_ms / 1000)

    def _drain(self, pipeline: Pipeline, query) -> int:
        """Let the in-flight batch finish uploading and commit, within the shutdown timeout."""
        deadline = time.monotonic() + self.config.shutdown_timeout_ms / 1000
        while pipeline.batch_running.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        drained = not pipeline.batch_running.is_set()
        if not drained:
            log.warning("shutdown timeout reached with uploads in flight; they will be replayed "
                        "from the committed offsets on the next start")
        query.stop()
        log.info("drained=%s; committed offsets are the restart point", drained)
        return EXIT_OK


def _first_line(error: object) -> str:
    return str(error).strip().splitlines()[0][:300] if error else "unknown"


def _summary(error: object) -> str:
    """Spark wraps Python errors in JVM stack traces; keep the lines that say what happened."""
    if error is None:
        return "unknown"
    lines = [line for line in str(error).splitlines() if line.strip()]
    wanted = [line for line in lines if "Error" in line or "Exception" in line or "failed" in line]
    return " | ".join((wanted or lines)[:6])[:2000]


def _import_quietly(module: str) -> None:
    """Import ahead of need; a failure is left for the main thread's own import to raise."""
    with contextlib.suppress(Exception):
        importlib.import_module(module)
