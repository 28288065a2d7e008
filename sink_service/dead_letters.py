"""Dead letters: bad records produced, unchanged, to `SINK_DLQ_TOPIC` under `SINK_ERROR_POLICY=dlq`.

Executor side: a range's bad records are produced as they are found, by one idempotent
`acks=all` producer per Python worker, and `DeadLetters.settle` flushes them before the range's
committable offset moves past them. A dead letter that is not acknowledged stops the range
there, as an outage: nothing past it is committed until a replay gets it through.

Each dead letter carries the original key, value and headers (order and repeats kept) and the
`sink.*` headers below; its own timestamp is the time it was produced, so the dead-letter topic's
retention counts from then. A replay of the range produces its dead letters again (at least once).

`python -m sink_service.dead_letters replay` moves dead letters back to their source topic after
a fix (see `replay`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, Message, Producer

from sink_service.decode.bad_records import BadRecord

log = logging.getLogger("sink_service.dead_letters")

HEADER_PREFIX = "sink."
ERROR_KIND = "sink.error.kind"  # the bad record's kind, as in sink_bad_records_total{reason}
ERROR_MESSAGE = "sink.error.message"  # why it could not become a row
SOURCE_TOPIC = "sink.source.topic"
SOURCE_PARTITION = "sink.source.partition"  # decimal text
SOURCE_OFFSET = "sink.source.offset"  # decimal text
SOURCE_TIMESTAMP = "sink.source.timestamp"  # the source record's timestamp, ms since the epoch, decimal text
MAX_MESSAGE_BYTES = 4096  # of the error message header: enough to act on, never a second copy of the record
# How long one dead letter may take to be acknowledged: a broker or topic problem then fails the
# range (replayed with backoff) instead of holding the task for librdkafka's default 5 minutes.
DELIVERY_TIMEOUT_MS = 30_000
_FLUSH_MARGIN_S = 5.0

# (client settings as sorted pairs) -> producer: one per Python worker, reused across tasks.
_producers: dict[Hashable, Producer] = {}


@dataclass(frozen=True)
class DeadLetterSpec:
    """Where dead letters go: the topic, and the service's Kafka client settings (SASL/TLS included)."""

    topic: str
    client_config: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, topic: str, client_config: Mapping[str, str]) -> DeadLetterSpec:
        return cls(topic, tuple(sorted(client_config.items())))

    def producer_config(self) -> dict[str, object]:
        return {
            **dict(self.client_config),
            "acks": "all",
            "enable.idempotence": True,  # a retried produce is not written twice
            "message.timeout.ms": DELIVERY_TIMEOUT_MS,
            "linger.ms": 5,
            # Bad records are rare; a flood of them waits for acknowledgements rather than
            # filling memory (librdkafka's default queue holds up to 1 GB).
            "queue.buffering.max.kbytes": 65_536,
        }


def _producer(spec: DeadLetterSpec) -> Producer:
    producer = _producers.get(spec.client_config)
    if producer is None:
        producer = _producers[spec.client_config] = Producer(spec.producer_config())
    return producer


def _discard_producer(spec: DeadLetterSpec) -> None:
    """After a failure: what is still queued must not arrive later, and an idempotent producer that
    hit an error may be unusable, so the next range starts with a new one."""
    producer = _producers.pop(spec.client_config, None)
    if producer is not None:
        producer.purge()
        producer.flush(0)


def dead_letter_headers(record: BadRecord, timestamp_ms: int,
                        original: Sequence[tuple[str, bytes | None]] | None) -> list[tuple[str, bytes]]:
    """The original headers, unchanged and in order, followed by the `sink.*` headers."""
    message = record.reason.encode()[:MAX_MESSAGE_BYTES].decode(errors="ignore")
    return [
        *(original or ()),
        (ERROR_KIND, record.kind.encode()),
        (ERROR_MESSAGE, message.encode()),
        (SOURCE_TOPIC, record.topic.encode()),
        (SOURCE_PARTITION, str(record.partition).encode()),
        (SOURCE_OFFSET, str(record.offset).encode()),
        (SOURCE_TIMESTAMP, str(timestamp_ms).encode()),
    ]


def original_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> list[tuple[str, bytes | None]]:
    """A dead letter's headers without the `sink.*` ones: the record as it was first produced."""
    return [(name, value) for name, value in headers or () if not name.startswith(HEADER_PREFIX)]


class DeadLetterError(Exception):
    """A dead letter was not acknowledged: the range must not be committed past it."""


@dataclass
class DeadLetters:
    """One range's dead letters: produced as found, acknowledged before its offsets are committed."""

    spec: DeadLetterSpec
    acknowledged: Counter = field(default_factory=Counter)  # kind -> dead letters acknowledged
    _sent: set[int] = field(default_factory=set)  # offsets produced in this range (a rewind reads them again)
    _unacknowledged: dict[int, str] = field(default_factory=dict)  # offset -> kind
    _failures: list[str] = field(default_factory=list)

    def send(self, raw: pa.RecordBatch, bad: Sequence[BadRecord]) -> None:
        """Produce each bad record of `raw` (a batch of `RAW_SCHEMA`) not yet produced by this range."""
        todo = [record for record in bad if record.offset not in self._sent]
        if not todo:
            return
        rows = raw.filter(pc.is_in(raw.column("offset"), pa.array([r.offset for r in todo], pa.int64())))
        originals = {row["offset"]: row for row in rows.to_pylist()}
        producer = _producer(self.spec)
        for record in todo:
            row = originals[record.offset]
            headers = dead_letter_headers(record, row["timestamp_ms"],
                                          [(h["key"], h["value"]) for h in row["headers"] or ()])
            self._produce(producer, row["key"], row["value"], headers, record)

    def _produce(self, producer: Producer, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]], record: BadRecord) -> None:
        def delivered(error: KafkaError | None, _message: Message) -> None:
            kind = self._unacknowledged.pop(record.offset, None)
            if error is not None:
                self._failures.append(f"{record.describe()}: {error.str()}")
            elif kind is not None:
                self.acknowledged[kind] += 1

        self._sent.add(record.offset)
        self._unacknowledged[record.offset] = record.kind
        while True:
            try:
                producer.produce(self.spec.topic, value=value, key=key, headers=headers, on_delivery=delivered)
                return
            except BufferError:  # the queue is full: wait for acknowledgements to make room
                if producer.flush(DELIVERY_TIMEOUT_MS / 1000 + _FLUSH_MARGIN_S) > 0:
                    break
        self._failures.append(f"{record.describe()}: the producer's queue stayed full")

    def settle(self) -> None:
        """Wait until every dead letter produced so far is acknowledged; raise if one is not."""
        if not self._sent:
            return
        producer = _producer(self.spec)
        left = producer.flush(DELIVERY_TIMEOUT_MS / 1000 + _FLUSH_MARGIN_S)
        if left and not self._failures:
            self._failures.append(f"{left} dead letter(s) not acknowledged in time")
        if self._failures:
            failures, self._failures = self._failures, []
            _discard_producer(self.spec)
            raise DeadLetterError(
                f"the dead-letter topic {self.spec.topic} did not take {len(failures)} bad record(s), "
                f"first {failures[0]}")
