"""Executor side: read one topic-partition offset range and yield it as Arrow record batches.

Consumers are cached per Python worker process and reused across tasks, because connecting
costs far more than reading a typical range. A consumer that goes silent on a range, or whose read
fails, is replaced: librdkafka clients that lived through a broker restart were seen never to be
answered again (the driver's AdminClient, proven; an executor's read stalled past a restart in
one CI run).

A record whose headers cannot be read (a header name that is not UTF-8: confluent-kafka reads names
as text only and hands back neither that record's names nor its other headers) is still read: its
headers become one `UNREADABLE_HEADERS` entry saying why, and the task makes it a bad record
under SINK_ERROR_POLICY (`invalid_header`). Raising would fail the read, and the replay would
meet the same record again: a stalled partition.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from sink_service.decode.headers import HEADERS
from sink_service.decode.raw import RAW_SCHEMA
from sink_service.shared.kafka_access import AccessWatch, KafkaAccessRefused, new_client
from sink_service.task.heap_release import release_if_grown
from sink_service.task.ranges import Range

log = logging.getLogger(__name__)

BATCH_RECORDS = 20_000
# A task's ranges that together hold at most this many records are fetched together (`read_groups`).
GROUP_RECORDS = BATCH_RECORDS
# A planned range lies below the last stable offset, so silence this long means trouble.
STALL_TIMEOUT_S = 120.0
# Silence this long on a range makes a new consumer, which resumes at the position reached.
RECONNECT_AFTER_S = 10.0

# The header name standing for a record's unreadable headers; its value says why. Never a name read
# from Kafka: librdkafka's names end at the first NUL byte.
UNREADABLE_HEADERS = "\x00unreadable-headers"

_consumers: dict[tuple[tuple[str, str], ...], Consumer] = {}
# A task may process several ranges at once (threads, see `datasource.read`); the cached consumer
# serves one read at a time (a reader holds it until its range is read).
_reading = threading.RLock()
_access: dict[tuple[tuple[str, str], ...], AccessWatch] = {}


def consumer_config(client_config: Mapping[str, str], group_id: str) -> dict[str, object]:
    return {
        **client_config,
        "group.id": group_id,  # never joins: ranges are assigned, commits happen on the driver
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        # Never jump silently: a range that fell out of retention is an error, not a reset.
        "auto.offset.reset": "error",
        "receive.message.max.bytes": 1_000_000_000,
        "queued.max.messages.kbytes": 65_536,
        # A range has a known end, so prefetching past it is waste: librdkafka's default keeps
        # 100,000 messages queued, fetched beyond the end and dropped at unassign, and a fetch
        # parked at the high watermark makes the broker work (noida-db spins ~0.4 cores on one)
        # while the range's tail is decoded. Fetch when the queue is empty, in large steps.
        "queued.min.messages": 1,
        # With the queue kept this short, librdkafka's default 1 s backoff after a full queue stalls
        # about one read in four for a second (measured at 20k records/s: p99 latency 9.2 s, 6.6 s
        # with 1 ms, at the same CPU).
        "fetch.queue.backoff.ms": 1,
        "max.partition.fetch.bytes": 8 * 1024 * 1024,
        # A range read to the log end leaves a fetch there, which Kafka holds for this long, and a consumer
        # has one fetch in flight per broker: with librdkafka's 500 ms the cached consumer's next range
        # waited for it, up to half a second per range (measured on tansu, which holds fetches as Kafka
        # does; noida-db answers at once). The consumer is unassigned right after its range, so a short
        # wait costs a few empty fetches at most.
        "fetch.wait.max.ms": 10,
    }


def _key(config: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in config.items()))


def _consumer(config: Mapping[str, object]) -> Consumer:
    """The cached consumer for `config`; its error callback (a callable cannot travel in Spark's
    options) is set here, so a refused login or certificate ends the read at once (see `access`)."""
    key = _key(config)
    consumer = _consumers.get(key)
    if consumer is None:
        watch = _access[key] = AccessWatch()
        consumer = _consumers[key] = new_client(Consumer, {**config, "error_cb": watch})
    return consumer


def _check_access(config: Mapping[str, object]) -> None:
    watch = _access.get(_key(config))
    if watch is not None:
        watch.check()


def _discard(config: Mapping[str, object]) -> None:
    """Close the cached consumer, if any: the next read makes a new one."""
    _access.pop(_key(config), None)
    consumer = _consumers.pop(_key(config), None)
    if consumer is not None:
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.close()


# confluent-kafka (2.16) meets a header name that is not UTF-8 by returning a half-built list (a
# tuple holding NULL) with the UnicodeDecodeError still set. A call through the C API turns that
# into a SystemError every time; CPython 3.11's specialised call opcode for a warm `m.headers()`
# does not check, so the broken list comes back (touching it crashes the interpreter) and the
# stale error surfaces somewhere later. Hence this caller, and each message asked once only.
_read_headers = operator.methodcaller("headers")


def _headers(messages: Sequence[Message]) -> list:
    """Each message's headers; one whose headers cannot be read gets an `UNREADABLE_HEADERS` entry."""
    out = []
    for message in messages:
        try:
            out.append(_read_headers(message))
        except (UnicodeDecodeError, SystemError) as exc:  # SystemError wraps the UnicodeDecodeError
            cause = exc if isinstance(exc, UnicodeDecodeError) else exc.__context__
            name = repr(cause.object) if isinstance(cause, UnicodeDecodeError) else "?"
            why = (f"a header name is not UTF-8 ({name}); the Kafka client reads header names as text only, "
                   "so this record's headers cannot be read")
            out.append([(UNREADABLE_HEADERS, why.encode())])
    return out


def unreadable_headers(raw: pa.RecordBatch) -> dict[int, str]:
    """Row -> why, for the records of `raw` (a batch of `RAW_SCHEMA`) whose headers could not be read."""
    headers = raw.column("headers")
    if headers.null_count == len(headers):
        return {}
    names = pc.list_flatten(headers).field("key")
    marked = pc.equal(names, UNREADABLE_HEADERS)
    if not pc.any(marked).as_py():
        return {}
    rows = pc.filter(pc.list_parent_indices(headers), marked).to_pylist()
    values = pc.filter(pc.list_flatten(headers).field("value"), marked).to_pylist()
    return {row: value.decode() for row, value in zip(rows, values, strict=True)}


def _batch(rng: Range, messages: list) -> pa.RecordBatch:
    n = len(messages)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([rng.topic] * n, pa.string()),
            pa.array([rng.partition] * n, pa.int32()),
            pa.array([m.offset() for m in messages], pa.int64()),
            pa.array([m.timestamp()[1] for m in messages], pa.int64()),
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.array(_headers(messages), HEADERS),
        ],
        schema=RAW_SCHEMA,
    )


def read_range(rng: Range, config: Mapping[str, object], max_batch_bytes: int) -> Iterator[pa.RecordBatch]:
    """Yield the records with offsets in [start, end) as Arrow batches of `RAW_SCHEMA`.

    A batch holds at most `BATCH_RECORDS` records and, past its first record, at most
    `max_batch_bytes` of keys and values: memory stays flat whether records are 100 B or 1 MB.
    """
    with _reading:
        yield from _read_alone(rng, config, max_batch_bytes)


def _read_alone(rng: Range, config: Mapping[str, object], max_batch_bytes: int) -> Iterator[pa.RecordBatch]:
    consumer = _consumer(config)
    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
    # Tens of thousands of message objects per batch would trigger the cyclic garbage collector
    # over and over (about a third of the read time); they hold no cycles, so pause it.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        position = rng.start
        pending: list = []
        pending_bytes = 0
        last_progress = last_consumer = time.monotonic()
        while position < rng.end:
            messages = consumer.consume(num_messages=min(BATCH_RECORDS, rng.end - position), timeout=1.0)
            _check_access(config)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # Transaction markers and compaction leave offsets with no record.
                        position = max(position, message.offset())
                        continue
                    raise KafkaException(
                        f"reading topic={rng.topic} partition={rng.partition} at offset {position}: {error}"
                    )
                if message.offset() >= rng.end:
                    position = rng.end
                    break
                size = len(message.value() or b"") + len(message.key() or b"")
                if pending and pending_bytes + size > max_batch_bytes:
                    yield _batch(rng, pending)
                    pending, pending_bytes = [], 0
                pending.append(message)
                pending_bytes += size
                position = message.offset() + 1
            now = time.monotonic()
            if messages:
                last_progress = now
            elif now - last_progress > STALL_TIMEOUT_S:
                raise TimeoutError(
                    f"no data from topic={rng.topic} partition={rng.partition} at offset {position} "
                    f"for {STALL_TIMEOUT_S:.0f}s (range ends at {rng.end}); is the broker reachable?"
                )
            elif now - max(last_progress, last_consumer) > RECONNECT_AFTER_S:
                log.warning("no data from topic=%s partition=%s at offset %d for %.0fs; reconnecting",
                            rng.topic, rng.partition, position, now - last_progress)
                consumer.unassign()
                _discard(config)
                consumer = _consumer(config)
                consumer.assign([TopicPartition(rng.topic, rng.partition, position)])
                last_consumer = now
            if len(pending) >= BATCH_RECORDS and position < rng.end:
                yield _batch(rng, pending)
                pending, pending_bytes = [], 0
        tail = _batch(rng, pending) if pending else None
    except Exception:
        _discard(config)  # the replay of this range starts on a new consumer
        raise
    finally:
        # Unassigned before the last batch is handed on: the caller decodes, writes and uploads
        # it before this generator resumes, and a consumer left assigned at the high watermark
        # keeps fetching meanwhile (noida-db answers such fetches at once, so both spin).
        if _consumers.get(_key(config)) is consumer:  # not closed by a failure
            consumer.unassign()
            # Served before a trim, the unassign frees the messages fetched past the range's end, so
            # the trim hands their pages back too (see `heap_release`); a live run's reads skip both.
            release_if_grown(free_first=lambda: consumer.consume(num_messages=1, timeout=0))
        if gc_was_enabled:
            gc.enable()
    if tail is not None:
        yield tail


Read = Callable[[Range], Iterator[pa.RecordBatch]]


def read_groups(ranges: Sequence[Range], config: Mapping[str, object],
                max_batch_bytes: int) -> Iterator[list[tuple[Range, Read]]]:
    """A task's ranges in the given order, in groups, each range with the reader that yields its records
    (`read_range`'s batches). A group of several ranges is fetched before it is handed on.

    One range after another, each read alone, paid a fetch round trip, an assign and an unassign per
    range: with many partitions each range is small (96 partitions at 20k records/s: ~1,000 records
    every 5 s) and those fixed costs, paid serially in one task per core, set the latency. So ranges
    that together hold at most `GROUP_RECORDS` records (and `max_batch_bytes`, the bound of one read
    batch) are fetched together, from one assignment of all their partitions; a larger range is a
    group alone, read as it is processed. A range the joint fetch did not finish (its bytes passed the
    bound, an error, silence) is continued by `read_range` from where it stopped, which reports its
    failure for that range alone.
    """
    for group in _groups(ranges):
        if len(group) == 1:
            yield [(group[0], lambda rng: read_range(rng, config, max_batch_bytes))]
            continue
        with _reading:
            fetched = _fetch_together(group, config, max_batch_bytes)
        yield [(rng, _prefetched(rng, *fetched.pop(rng), config, max_batch_bytes)) for rng in group]


def _groups(ranges: Sequence[Range]) -> list[list[Range]]:
    """Consecutive ranges of at most `GROUP_RECORDS` records in all; a larger range alone."""
    groups: list[list[Range]] = []
    records = GROUP_RECORDS + 1
    for rng in ranges:
        if records + rng.records > GROUP_RECORDS:
            groups.append([])
            records = 0
        groups[-1].append(rng)
        records += rng.records
    return groups


def _prefetched(planned: Range, batch: pa.RecordBatch | None, reached: int, config: Mapping[str, object],
                max_batch_bytes: int) -> Read:
    """The reader of `planned`: its fetched records, then `read_range` from `reached` on. Any other
    range (what is left after a failed write, read again) is read by `read_range`."""
    held = [batch]

    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        if rng != planned or not held:
            yield from read_range(rng, config, max_batch_bytes)
            return
        prefix = held.pop()
        if prefix is not None:
            yield prefix
            del prefix
        if reached < rng.end:
            yield from read_range(Range(rng.topic, rng.partition, reached, rng.end), config, max_batch_bytes)

    return read


class _Fetch:
    """One range's part of a joint fetch. A plain class: hashing the frozen `Range` for every message
    was a third of the joint fetch's CPU."""

    __slots__ = ("end", "messages", "open", "position", "range")

    def __init__(self, rng: Range):
        self.range, self.end, self.position = rng, rng.end, rng.start
        self.messages: list = []
        self.open = rng.records > 0


def _fetch_together(group: Sequence[Range], config: Mapping[str, object],
                    max_batch_bytes: int) -> dict[Range, tuple[pa.RecordBatch | None, int]]:
    """Per range, the records fetched (a batch, or None) and the offset reached: one assignment of every
    range's partition, consumed until each range is read, the bytes pass `max_batch_bytes`, an error
    comes, or nothing arrives for `RECONNECT_AFTER_S`. Never raises for Kafka: what is not read here
    is read by `read_range`, which reports it for its range alone."""
    fetches = {(rng.topic, rng.partition): _Fetch(rng) for rng in group}
    consumer: Consumer | None = None
    gc_was_enabled = gc.isenabled()
    gc.disable()  # see read_range
    held_bytes = 0
    try:
        consumer = _consumer(config)
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start) for rng in group])
        last_progress = time.monotonic()
        while wanted := sum(f.end - f.position for f in fetches.values() if f.open):
            batch = consumer.consume(num_messages=min(BATCH_RECORDS, wanted), timeout=1.0)
            _check_access(config)
            for message in batch:
                fetch = fetches.get((message.topic(), message.partition()))
                error = message.error()
                if fetch is None:
                    if error is not None:  # not about one partition: what is left goes to read_range
                        return _fetched(fetches)
                    continue
                if not fetch.open:
                    continue
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # Transaction markers and compaction leave offsets with no record.
                        fetch.position = max(fetch.position, min(fetch.end, message.offset()))
                        fetch.open = fetch.position < fetch.end
                    else:
                        fetch.open = False  # read_range meets the error again and reports it
                    continue
                offset = message.offset()
                if offset >= fetch.end:
                    fetch.position, fetch.open = fetch.end, False
                    continue
                size = len(message.value() or b"") + len(message.key() or b"")
                if held_bytes and held_bytes + size > max_batch_bytes:
                    return _fetched(fetches)
                fetch.messages.append(message)
                held_bytes += size
                fetch.position = offset + 1
                fetch.open = fetch.position < fetch.end
            now = time.monotonic()
            if batch:
                last_progress = now
            elif now - last_progress > RECONNECT_AFTER_S:
                silent = [f"topic={f.range.topic} partition={f.range.partition} at offset {f.position}"
                          for f in fetches.values() if f.open]
                log.warning("no data for %d ranges read together (%s) for %.0fs; reading them one by one",
                            len(silent), ", ".join(silent), now - last_progress)
                _discard(config)
                return _fetched(fetches)
        return _fetched(fetches)
    except KafkaAccessRefused:
        return _fetched(fetches)  # each range's read_range reports it
    except KafkaException as exc:
        log.warning("reading %d ranges together failed (%s); reading them one by one", len(group), exc)
        _discard(config)
        return _fetched(fetches)
    finally:
        if consumer is not None and _consumers.get(_key(config)) is consumer:
            consumer.unassign()
            release_if_grown(free_first=lambda: consumer.consume(num_messages=1, timeout=0))
        if gc_was_enabled:
            gc.enable()


def _fetched(fetches: dict[tuple[str, int], _Fetch]) -> dict[Range, tuple[pa.RecordBatch | None, int]]:
    return {f.range: (_batch(f.range, f.messages) if f.messages else None, f.position) for f in fetches.values()}
