"""Executor side: one Spark task turns one offset range into uploaded Parquet files.

read -> decode -> Parquet -> upload runs here, in the task's Python worker, so records never
cross into the JVM and the driver only plans and commits.
The task never raises for data or upload problems: it reports how far it got
(`committable`: every offset below it is uploaded or deliberately skipped) and why it stopped,
and the driver decides what to commit and whether to replay or stop.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from sink_service.kafka_source.admission import Range
from sink_service.parquet_files import ClosedFile, PartitionFileWriter
from sink_service.records import BadRecord, DecodeSpec, decode
from uploader.errors import FatalUploadError, RetryableUploadError
from uploader.target import FileMetadata, Receipt, UploadTarget

log = logging.getLogger("sink_service.task")

STATUS_OK = "ok"
STATUS_RETRYABLE = "retryable"  # replay from the committed offsets
STATUS_FATAL = "fatal"  # stop the service: retrying cannot fix it

_DDL_TYPES = {pa.string(): "STRING", pa.int32(): "INT", pa.int64(): "BIGINT"}
RESULT_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("range_start", pa.int64()),
    ("range_end", pa.int64()),
    ("committable", pa.int64()),
    ("status", pa.string()),
    ("error", pa.string()),
    ("failure_class", pa.string()),  # "", "retryable" or "fatal": upload failures only
    ("records_read", pa.int64()),
    ("records_written", pa.int64()),
    ("records_uploaded", pa.int64()),
    ("bad_records", pa.int64()),
    ("bad_reasons", pa.string()),  # JSON {kind: count}
    ("bad_samples", pa.string()),  # JSON list of BadRecord descriptions
    ("retries", pa.string()),  # JSON {reason: count}
    ("files", pa.string()),  # JSON list of uploaded file descriptions
])
RESULT_SCHEMA_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in RESULT_SCHEMA)
MAX_BAD_SAMPLES = 20


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs; pickled into the Spark plan once per query."""

    decode: DecodeSpec
    target_settings: Hashable
    build_target: Callable[[Hashable], UploadTarget]
    table_template: str
    scratch_dir: str
    flush_bytes: int
    flush_records: int
    compression: str
    error_policy: str

    def table_for(self, topic: str) -> str:
        return self.table_template.replace("{topic}", topic)


_targets: dict[Hashable, UploadTarget] = {}


def _target(spec: TaskSpec) -> UploadTarget:
    """One target (and its HTTP connection pool) per Python worker, reused across tasks."""
    target = _targets.get(spec.target_settings)
    if target is None:
        target = _targets[spec.target_settings] = spec.build_target(spec.target_settings)
    return target


class _StopRange(Exception):
    """Ends a range early; the outcome is already recorded."""


@dataclass
class _Outcome:
    topic: str = ""
    partition: int = -1
    range_start: int = -1
    range_end: int = -1
    committable: int = -1
    status: str = STATUS_OK
    error: str = ""
    failure_class: str = ""
    records_read: int = 0
    records_written: int = 0
    records_uploaded: int = 0
    bad_records: int = 0
    bad_reasons: Counter = field(default_factory=Counter)
    bad_samples: list[str] = field(default_factory=list)
    retries: Counter = field(default_factory=Counter)
    files: list[dict] = field(default_factory=list)

    def to_batch(self) -> pa.RecordBatch:
        row = {name: getattr(self, name) for name in RESULT_SCHEMA.names}
        for name in ("bad_reasons", "bad_samples", "retries", "files"):
            row[name] = json.dumps(row[name])
        return pa.RecordBatch.from_pylist([row], schema=RESULT_SCHEMA)


class _RangeProcessor:
    def __init__(self, spec: TaskSpec, rng: Range):
        self.spec = spec
        o = self.outcome = _Outcome(
            topic=rng.topic, partition=rng.partition, range_start=rng.start, range_end=rng.end
        )
        o.committable = o.range_start
        self.writer = PartitionFileWriter(
            Path(spec.scratch_dir) / "files",
            o.topic,
            o.partition,
            max_bytes=spec.flush_bytes,
            max_records=spec.flush_records,
            compression=spec.compression,
            on_close=self._upload,
        )

    def _upload(self, closed: ClosedFile) -> None:
        spec, o = self.spec, self.outcome
        metadata = FileMetadata(
            topic=closed.topic,
            partition=closed.partition,
            first_offset=closed.first_offset,
            last_offset=closed.last_offset,
            record_count=closed.record_count,
            target_table=spec.table_for(closed.topic),
            primary_keys=spec.decode.primary_keys,
            order_column=spec.decode.order_field,
            schema_fingerprint=closed.schema_fingerprint,
        )
        o.records_written += closed.record_count
        try:
            receipt: Receipt = _target(spec).upload(closed.path, metadata, on_retry=self._count_retry)
        except FatalUploadError as exc:
            o.failure_class = STATUS_FATAL
            self._stop(STATUS_FATAL, f"upload of {metadata.file_name()} rejected: {exc}")
        except RetryableUploadError as exc:
            o.failure_class = STATUS_RETRYABLE
            self._stop(STATUS_RETRYABLE, f"upload of {metadata.file_name()} failed: {exc}")
        finally:
            closed.path.unlink(missing_ok=True)
        o.records_uploaded += closed.record_count
        o.committable = closed.last_offset + 1
        o.files.append({
            "file": metadata.file_name(),
            "first_offset": closed.first_offset,
            "last_offset": closed.last_offset,
            "records": closed.record_count,
            "bytes": receipt.bytes,
            "attempts": receipt.attempts,
            "duration_s": round(receipt.duration_s, 3),
            "response_id": receipt.response_id,
            "location": receipt.location,
        })

    def _count_retry(self, error: RetryableUploadError, _attempt: int, _wait_s: float) -> None:
        self.outcome.retries[error.reason] += 1

    def _stop(self, status: str, error: str) -> None:
        self.outcome.status, self.outcome.error = status, error
        raise _StopRange(error)

    def _reject(self, bad: list[BadRecord]) -> None:
        o = self.outcome
        o.bad_records += len(bad)
        for record in bad:
            o.bad_reasons[record.kind] += 1
            if len(o.bad_samples) < MAX_BAD_SAMPLES:
                o.bad_samples.append(record.describe())
            if self.spec.error_policy == "skip":
                log.warning("skipped bad record %s", record.describe())

    def process(self, raw: pa.RecordBatch) -> None:
        o = self.outcome
        chunk = decode(raw, self.spec.decode)
        o.records_read += raw.num_rows
        if chunk.bad_records and self.spec.error_policy == "fail":
            first_bad = chunk.bad_records[0]
            for segment in chunk.segments:
                before = segment.filter(pa.compute.less(segment.column("_offset"), first_bad.offset))
                if before.num_rows:
                    self.writer.append(before)
            self.writer.finish()
            self._reject([first_bad])
            o.committable = first_bad.offset
            self._stop(
                STATUS_FATAL,
                f"bad record {first_bad.describe()}. SINK_ERROR_POLICY=fail stops here; fix or "
                "remove the record upstream, or set SINK_ERROR_POLICY=skip to log and skip such records.",
            )
        self._reject(chunk.bad_records)
        for segment in chunk.segments:
            self.writer.append(segment)

    def finish(self) -> None:
        self.writer.finish()
        self.outcome.committable = self.outcome.range_end


def process_range(spec: TaskSpec, rng: Range, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch:
    """Decode, write and upload one offset range; return its outcome as a one-row batch."""
    processor = _RangeProcessor(spec, rng)
    started = time.monotonic()
    try:
        for raw in batches:
            processor.process(raw)
        processor.finish()
    except _StopRange:
        processor.writer.abandon()
    except Exception as exc:  # report, never hide: the driver logs it and replays the range
        log.exception("range %s failed", rng)
        processor.writer.abandon()
        processor.outcome.status = STATUS_RETRYABLE
        processor.outcome.error = f"{type(exc).__name__}: {exc}"
    log.debug("range %s done in %.2fs", rng, time.monotonic() - started)
    return processor.outcome.to_batch()
