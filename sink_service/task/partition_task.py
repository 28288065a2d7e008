"""Executor side: one Spark task turns one offset range into uploaded Parquet files.

read -> decode -> Parquet -> upload runs here, in the task's Python worker, so records never
cross into the JVM and the driver only plans and commits.
The task never raises for data or upload problems: it reports how far it got
(`committable`: every offset below it is uploaded or deliberately skipped) and why it stopped,
and the driver decides what to commit and whether to replay or stop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sink_service.decode import BadRecord, DecodedChunk, DecodeSpec, decode
from sink_service.decode.compact import FileCompactor
from sink_service.decode.registry import RegistryRefused, RegistryUnavailable
from sink_service.logs import WorkerLogging, configure_worker, current
from sink_service.shared.kafka_access import KafkaAccessRefused
from sink_service.task.dead_letters import DeadLetterError, DeadLetterRefused, DeadLetters, DeadLetterSpec
from sink_service.task.outcomes import (
    ERROR_DEAD_LETTER,
    ERROR_PROCESSING,
    ERROR_READ,
    ERROR_UPLOAD,
    RESULT_COLUMNS,
    STATUS_FATAL,
    STATUS_OK,
    STATUS_RETRYABLE,
)
from sink_service.task.parquet_files import ClosedFile, PartitionFileWriter
from sink_service.task.range_reader import unreadable_headers
from sink_service.task.ranges import Range
from sink_service.task.upload_signals import NO_SIGNALS, SignalChannel, SignalSender
from sink_service.transform.rows import Transform, TransformFailed
from uploader.column_types import encode_schema, join_schemas
from uploader.errors import FatalUploadError, RetryableUploadError
from uploader.parking import PARKED_TARGET
from uploader.target import FileMetadata, Receipt, UploadTarget

log = logging.getLogger("sink_service.task")

_ARROW_TYPES = {"STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64()}
RESULT_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in RESULT_COLUMNS])
MAX_BAD_SAMPLES = 20
_JSON_FIELDS = frozenset(("bad_reasons", "bad_samples", "dead_letters", "retries", "files"))


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs; each Python worker builds it from the driver's `TaskRecipe` (task/recipe.py)."""

    decode: DecodeSpec
    target_settings: Hashable
    build_target: Callable[[Hashable], UploadTarget]
    table_template: str
    scratch_dir: str
    flush_bytes: int
    flush_records: int
    compression: str
    error_policy: str
    compact_files: bool = False  # SINK_COMPACT_FILES: each file holds only the latest row per key
    # The target fits each file to its typed table (Delta): files keep their own types, so a file the table
    # refuses never raises later ones, and carry `_offset` as bookkeeping (parquet_files).
    typed_table: bool = False
    signals: SignalChannel = NO_SIGNALS  # live upload signals to the driver
    dead_letters: DeadLetterSpec | None = None  # required with error_policy "dlq"
    transform: Transform | None = None  # SINK_TRANSFORM_SQL, run on each decoded segment
    # The driver's log format and secret scrubber (the recipe's), installed in each Python worker by
    # `process_range`.
    logging: WorkerLogging | None = field(default_factory=current)

    def table_for(self, topic: str) -> str:
        return self.table_template.replace("{topic}", topic)


_targets: dict[Hashable, UploadTarget] = {}
_targets_lock = threading.Lock()  # a task processes several ranges at once (datasource.read)


def _target(spec: TaskSpec) -> UploadTarget:
    """One target (and its HTTP connection pool) per Python worker, reused across tasks and threads."""
    with _targets_lock:
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
    error_kind: str = ""
    records_read: int = 0
    records_written: int = 0
    records_uploaded: int = 0
    records_filtered: int = 0
    bad_records: int = 0
    bad_reasons: Counter = field(default_factory=Counter)
    bad_samples: list[str] = field(default_factory=list)
    dead_letters: Counter = field(default_factory=Counter)
    retries: Counter = field(default_factory=Counter)
    files: list[dict] = field(default_factory=list)
    written_schema: str = ""

    def to_batch(self) -> pa.RecordBatch:
        """One row; built column by column (`from_pylist` took a fifth of a millisecond, paid per range)."""
        columns = []
        for column in RESULT_SCHEMA:
            value = getattr(self, column.name)
            if column.name in _JSON_FIELDS:
                value = json.dumps(value)
            columns.append(pa.array([value], column.type))
        return pa.RecordBatch.from_arrays(columns, schema=RESULT_SCHEMA)


class _RangeProcessor:
    def __init__(self, spec: TaskSpec, rng: Range, floor: pa.Schema | None):
        self.spec = spec
        self.decode_spec = spec.decode  # holds the primary keys once learned from the keys
        self._signals = SignalSender(spec.signals, (rng.topic, rng.partition, rng.start))
        o = self.outcome = _Outcome(
            topic=rng.topic, partition=rng.partition, range_start=rng.start, range_end=rng.end
        )
        o.committable = o.range_start
        self._bad_at_commit: tuple[int, Counter, list[str]] = (0, Counter(), [])
        self._filtered_at_commit = 0
        self._dead_letters = DeadLetters(spec.dead_letters) if spec.error_policy == "dlq" else None
        self.writer = PartitionFileWriter(
            Path(spec.scratch_dir) / "files",
            o.topic,
            o.partition,
            max_bytes=spec.flush_bytes,
            max_records=spec.flush_records,
            compression=spec.compression,
            on_close=self._upload,
            floor=floor,
            unstored=spec.decode.unstored_columns,
            bookkeeping=spec.decode.unstored_columns if spec.typed_table else (),
            typed_table=spec.typed_table,
            compactor=self._new_compactor,
        )

    def _new_compactor(self) -> FileCompactor | None:
        """Asked per file: primary keys learned from the keys are known once the first rows are."""
        keys = self.decode_spec.primary_keys
        return FileCompactor(keys, self.spec.decode.order_field) if self.spec.compact_files and keys else None

    def _upload(self, closed: ClosedFile) -> None:
        spec, o = self.spec, self.outcome
        metadata = FileMetadata(
            topic=closed.topic,
            partition=closed.partition,
            first_offset=closed.first_offset,
            last_offset=closed.last_offset,
            record_count=closed.record_count,
            target_table=spec.table_for(closed.topic),
            primary_keys=self.decode_spec.primary_keys,
            order_column=spec.decode.order_field,
            schema_fingerprint=closed.schema_fingerprint,
        )
        o.records_written += closed.record_count
        self._signals.started(metadata.file_name())
        try:
            receipt: Receipt = _target(spec).upload(closed.path, metadata, on_retry=self._count_retry)
        except FatalUploadError as exc:
            o.failure_class, o.error_kind = STATUS_FATAL, ERROR_UPLOAD
            self._stop(STATUS_FATAL, f"upload of {metadata.file_name()} rejected: {exc}")
        except RetryableUploadError as exc:
            o.failure_class, o.error_kind = STATUS_RETRYABLE, ERROR_UPLOAD
            self._stop(STATUS_RETRYABLE, f"upload of {metadata.file_name()} failed: {exc}")
        finally:
            closed.path.unlink(missing_ok=True)
            self._signals.finished(metadata.file_name())
        parked = receipt.target == PARKED_TARGET
        if parked:  # the endpoint refused the content: set aside, so the range continues
            log.error(
                "file rejected and parked topic=%s partition=%d offsets=%d-%d status=%s parked_at=%s",
                closed.topic, closed.partition, closed.first_offset, closed.last_offset,
                receipt.details.get("status"), receipt.location)
        else:
            o.records_uploaded += closed.record_count
        self._settle_dead_letters(closed.last_offset + 1)
        o.committable = closed.last_offset + 1
        self._bad_at_commit = (o.bad_records, Counter(o.bad_reasons), list(o.bad_samples))
        self._filtered_at_commit = o.records_filtered
        o.files.append({
            "parked": receipt.details.get("reason") if parked else None,
            "file": metadata.file_name(),
            "first_offset": closed.first_offset,
            "last_offset": closed.last_offset,
            "records": closed.record_count,
            "bytes": receipt.bytes,
            "attempts": receipt.attempts,
            "duration_s": round(receipt.duration_s, 3),
            "response_id": receipt.response_id,
            "location": receipt.location,
            # What the driver needs to apply a staged file itself (a Delta table: driver.delta_batches).
            "primary_keys": list(metadata.primary_keys),
            "order_column": metadata.order_column,
            "schema_fingerprint": metadata.schema_fingerprint,
            "decoded_bytes": closed.decoded_bytes,
        })

    def _count_retry(self, error: RetryableUploadError, _attempt: int, _wait_s: float) -> None:
        self.outcome.retries[error.reason] += 1
        self._signals.retried(error.reason, str(error))

    def _settle_dead_letters(self, committable: int) -> None:
        """Before the committable offset moves: every dead letter below it must be acknowledged."""
        if self._dead_letters is None:
            return
        try:
            self._dead_letters.settle(committable)
        except KafkaAccessRefused as exc:
            self.outcome.error_kind = ERROR_DEAD_LETTER
            self._stop(STATUS_FATAL, f"producing dead letters to {self._dead_letters.spec.topic}: {exc} (nothing "
                                     f"from offset {self.outcome.committable} on is committed)")
        except DeadLetterRefused as exc:
            self.outcome.error_kind = ERROR_DEAD_LETTER
            self._stop(STATUS_FATAL, f"{exc} (offset {self.outcome.committable} on). Fix SINK_DLQ_TOPIC as said "
                                     "and restart; the service resumes there.")
        except DeadLetterError as exc:
            self.outcome.error_kind = ERROR_DEAD_LETTER
            self._stop(STATUS_RETRYABLE, f"{exc}; nothing from offset {self.outcome.committable} on is committed "
                                         "until a replay gets the dead letters through")
        finally:
            self.outcome.dead_letters = Counter(self._dead_letters.acknowledged)

    def _stop(self, status: str, error: str) -> None:
        self.outcome.status, self.outcome.error = status, error
        raise _StopRange(error)

    def _reject(self, bad: list[BadRecord], *, log_as: str = "") -> None:
        o = self.outcome
        o.bad_records += len(bad)
        for record in bad:
            o.bad_reasons[record.kind] += 1
            if len(o.bad_samples) < MAX_BAD_SAMPLES:
                o.bad_samples.append(record.describe())
            if log_as:
                log.warning("%s bad record %s", log_as, record.describe())

    def process(self, raw: pa.RecordBatch) -> None:
        self.outcome.records_read += raw.num_rows
        for part, bad in _readable_runs(raw):
            self._write(DecodedChunk(bad_records=[bad]) if bad else decode(part, self.decode_spec, self.spec.transform),
                        part)

    def process_carefully(self, raw: pa.RecordBatch) -> None:
        """Like `process`, but a batch that cannot be decoded, transformed or encoded is halved until
        the records at fault are found; each becomes a bad record under the error policy."""
        self.outcome.records_read += raw.num_rows
        for part, bad in _readable_runs(raw):
            for chunk in [DecodedChunk(bad_records=[bad])] if bad else _bisect_unwritable(
                    part, self.decode_spec, self.spec.transform):
                self._write(chunk, part)

    def _write(self, chunk: DecodedChunk, raw: pa.RecordBatch) -> None:
        """Write a chunk decoded (and transformed) from (part of) `raw`; its bad records under the
        error policy. Records the transform filtered out are only counted: done with, like written ones."""
        o = self.outcome
        o.records_filtered += chunk.filtered
        if chunk.primary_keys != self.decode_spec.primary_keys:  # learned from the first key
            self.decode_spec = dataclasses.replace(self.decode_spec, primary_keys=chunk.primary_keys)
        if chunk.bad_records and self.spec.error_policy == "fail":
            first_bad = chunk.bad_records[0]
            self._reject([s for s in chunk.skipped if s.offset < first_bad.offset])
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
        self._reject(chunk.skipped)  # left out on purpose (tombstones): never a failure
        if self._dead_letters is not None:
            self._reject(chunk.bad_records, log_as=f"dead-lettering to {self._dead_letters.spec.topic}")
            self._dead_letters.send(raw, chunk.bad_records)  # acknowledged before the offsets are committed
        else:
            self._reject(chunk.bad_records, log_as="skipped")
        for segment in chunk.segments:
            self.writer.append(segment)

    def rewind(self) -> Range:
        """Drop the open file and what was counted after the last upload; return what is left."""
        self.writer.abandon()
        o = self.outcome
        o.bad_records, o.bad_reasons, o.bad_samples = self._bad_at_commit
        o.bad_reasons, o.bad_samples = Counter(o.bad_reasons), list(o.bad_samples)
        o.records_filtered = self._filtered_at_commit
        return Range(o.topic, o.partition, o.committable, o.range_end)

    def finish(self) -> None:
        self.writer.finish()
        self._settle_dead_letters(self.outcome.range_end)
        self.outcome.committable = self.outcome.range_end


# Errors that some record's content can cause. Anything else (disk full, out of memory) is the
# environment's: blaming it on records would skip good ones, so it is only reported.
DATA_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, pa.ArrowCapacityError,
               pa.ArrowIndexError, pa.ArrowKeyError, ValueError, TypeError, OverflowError, RecursionError)


class _ReadFailed(Exception):
    """Reading from Kafka failed: an outage to retry, not a problem of the records."""


def _reading(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Mark errors raised while reading, so they are not mistaken for bad records."""
    while True:
        try:
            raw = next(batches)
        except StopIteration:
            return
        except KafkaAccessRefused:
            raise  # not an outage: retrying cannot fix the credentials or the CA
        except Exception as exc:
            raise _ReadFailed(f"{type(exc).__name__}: {exc}") from exc
        yield raw


def _readable_runs(raw: pa.RecordBatch) -> Iterator[tuple[pa.RecordBatch, BadRecord | None]]:
    """`raw` in offset order as runs of records to decode, and each record whose headers could not
    be read (see `range_reader.UNREADABLE_HEADERS`) alone, as an `invalid_header` bad record: the
    policy decides, the records before it are written first, and its dead letter carries its key
    and value without the marker."""
    unreadable = unreadable_headers(raw)
    if not unreadable:
        yield raw, None
        return
    start = 0
    for row, why in sorted(unreadable.items()):
        if row > start:
            yield raw.slice(start, row - start), None
        one = raw.slice(row, 1)
        field = one.schema.get_field_index("headers")
        one = one.set_column(field, "headers", pa.nulls(1, one.schema.field(field).type))
        yield one, BadRecord(one.column("topic")[0].as_py(), one.column("partition")[0].as_py(),
                             one.column("offset")[0].as_py(), why, "invalid_header")
        start = row + 1
    if start < raw.num_rows:
        yield raw.slice(start), None


def _probe(table: pa.Table) -> None:
    """Encode to memory exactly as a file would be: raises what writing these rows would raise."""
    pq.write_table(table, pa.BufferOutputStream())


def _bisect_unwritable(raw: pa.RecordBatch, spec: DecodeSpec, transform: Transform | None) -> Iterator[DecodedChunk]:
    """Decoded chunks in offset order; a record that cannot be decoded, transformed or encoded is a bad record."""
    try:
        chunk = decode(raw, spec, transform)
        for segment in chunk.segments:
            _probe(segment)
    except DATA_ERRORS as exc:
        if raw.num_rows == 1:
            failed = isinstance(exc, TransformFailed)
            yield DecodedChunk(bad_records=[BadRecord(
                raw.column("topic")[0].as_py(), raw.column("partition")[0].as_py(), raw.column("offset")[0].as_py(),
                str(exc) if failed else f"cannot be written: {type(exc).__name__}: {exc}",
                "transform_failed" if failed else "unwritable",
            )])
            return
        half = raw.num_rows // 2
        yield from _bisect_unwritable(raw.slice(0, half), spec, transform)
        yield from _bisect_unwritable(raw.slice(half), spec, transform)
        return
    yield chunk


def process_range(
    spec: TaskSpec, rng: Range, read: Callable[[Range], Iterator[pa.RecordBatch]], floor: pa.Schema | None = None,
) -> pa.RecordBatch:
    """Decode, write and upload one offset range; return its outcome as a one-row batch.

    An error that is neither an upload nor a read failure is blamed on the records: what is
    left of the range (from the last uploaded file on) is read again and handled record by
    record where needed, so one unwritable record becomes a bad record instead of a replay loop.
    """
    configure_worker(spec.logging)  # once per worker process: its lines as the driver's, scrubbed
    processor = _RangeProcessor(spec, rng, floor)
    o = processor.outcome
    started = time.monotonic()
    try:
        try:
            for raw in _reading(read(rng)):
                processor.process(raw)
            processor.finish()
        except DATA_ERRORS as exc:
            rest = processor.rewind()
            log.warning("range %s failed while writing (%s: %s); reading offsets %d-%d again, "
                        "record by record where needed", rng, type(exc).__name__, exc, rest.start, rest.end - 1)
            for raw in _reading(read(rest)):
                processor.process_carefully(raw)
            processor.finish()
    except _StopRange:
        processor.writer.abandon()
    except KafkaAccessRefused as exc:
        processor.writer.abandon()
        o.status, o.error_kind, o.error = STATUS_FATAL, ERROR_READ, str(exc)
    except _ReadFailed as exc:
        processor.writer.abandon()
        o.status, o.error_kind, o.error = STATUS_RETRYABLE, ERROR_READ, f"reading from Kafka failed: {exc}"
    except RegistryUnavailable as exc:  # an outage like the broker's: never the records' fault
        processor.writer.abandon()
        o.status, o.error_kind, o.error = STATUS_RETRYABLE, ERROR_READ, str(exc)
    except RegistryRefused as exc:
        processor.writer.abandon()
        o.status, o.error_kind, o.error = STATUS_FATAL, ERROR_READ, str(exc)
    except Exception as exc:  # report, never hide: the driver logs it, replays and counts repeats
        log.exception("range %s failed", rng)
        processor.writer.abandon()
        o.status, o.error_kind, o.error = STATUS_RETRYABLE, ERROR_PROCESSING, f"{type(exc).__name__}: {exc}"
    log.debug("range %s done in %.2fs", rng, time.monotonic() - started)
    o.written_schema = _widened(floor, processor.writer.written_schema)
    return o.to_batch()


def _widened(floor: pa.Schema | None, written: pa.Schema | None) -> str:
    """The topic's types after this range, encoded, or "" when its files added nothing to the floor.

    Joined here, where pyarrow is loaded anyway: the driver learns nothing from most ranges, and
    needs the type lattice (and pyarrow) only when ranges of one batch widened a topic differently.
    """
    if written is None:
        return ""
    if floor is None:
        return encode_schema(written)
    joined = join_schemas(floor, written)
    return "" if joined.equals(floor) else encode_schema(joined)
