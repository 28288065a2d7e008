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
import sys
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

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
    client_config: tuple[tuple[str, str], ...] = field(repr=False)  # may hold SASL/TLS secrets

    @classmethod
    def of(cls, topic: str, client_config: Mapping[str, str]) -> DeadLetterSpec:
        return cls(topic, tuple(sorted(client_config.items())))



def producer_config(client_config: Mapping[str, str]) -> dict[str, object]:
    """The service's client settings, for a producer whose every record must be acknowledged."""
    return {
        **client_config,
        "acks": "all",
        "enable.idempotence": True,  # a retried produce is not written twice
        "message.timeout.ms": DELIVERY_TIMEOUT_MS,
        "linger.ms": 5,
        # Bad records are rare; a flood of them waits for acknowledgements rather than filling
        # memory (librdkafka's default queue holds up to 1 GB).
        "queue.buffering.max.kbytes": 65_536,
    }


def _producer(spec: DeadLetterSpec) -> Producer:
    producer = _producers.get(spec.client_config)
    if producer is None:
        producer = _producers[spec.client_config] = Producer(producer_config(dict(spec.client_config)))
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
    _failures: dict[int, str] = field(default_factory=dict)  # offset -> why it was not acknowledged

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
                self._failures[record.offset] = f"{record.describe()}: {error.str()}"
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
                    failure = "the producer's queue stayed full"
                    break
            except KafkaException as exc:  # refused before sending, e.g. larger than message.max.bytes
                failure = str(exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else exc)
                break
        self._unacknowledged.pop(record.offset, None)
        self._failures[record.offset] = f"{record.describe()}: {failure}"

    def settle(self, below: int) -> None:
        """Wait for the acknowledgements; raise if a dead letter with an offset below `below` (the
        next committable offset) is not acknowledged. Later ones are judged when that moves past them."""
        if not self._sent:
            return
        _producer(self.spec).flush(DELIVERY_TIMEOUT_MS / 1000 + _FLUSH_MARGIN_S)
        for offset in self._unacknowledged:  # left after the flush: timed out
            self._failures.setdefault(offset, f"offset={offset}: not acknowledged within {DELIVERY_TIMEOUT_MS} ms")
        blocking = sorted(offset for offset in self._failures if offset < below)
        if blocking:
            first = self._failures[blocking[0]]
            self._failures.clear()
            _discard_producer(self.spec)
            raise DeadLetterError(
                f"the dead-letter topic {self.spec.topic} did not take {len(blocking)} bad record(s), first {first}")


# --- replay: dead letters back to their source topic ---------------------------------------------

REPLAY_CHUNK = 500  # records produced, acknowledged and committed together


class ReplayError(Exception):
    """The replay stopped; what it committed before is done, the rest is read again next time."""


@dataclass(frozen=True)
class ReplayFilter:
    reason: str | None = None  # only dead letters of this kind (sink.error.kind)
    source_topic: str | None = None  # only dead letters from this topic (sink.source.topic)

    def accepts(self, headers: Mapping[str, bytes | None]) -> bool:
        return all(wanted is None or (headers.get(name) or b"").decode(errors="replace") == wanted
                   for name, wanted in ((ERROR_KIND, self.reason), (SOURCE_TOPIC, self.source_topic)))


def replay_group(base: str, dlq: str, selection: ReplayFilter) -> str:
    """One consumer group per dead-letter topic and filter: a replay of one reason moves no other
    filter's position, so a later replay of another reason still finds its records."""
    parts = [f"{base}-replay-{dlq}"]
    parts += [f"reason-{selection.reason}"] if selection.reason else []
    parts += [f"topic-{selection.source_topic}"] if selection.source_topic else []
    return "-".join(parts)


def replay(client_config: Mapping[str, str], dlq: str, group: str, selection: ReplayFilter = ReplayFilter(),
           to: str | None = None, dry_run: bool = False) -> Counter:
    """Produce the dead letters of `dlq` past `group`'s committed offsets, up to the end of the
    topic when called, back to their source topic (or `to`) with their original key, value and
    headers; the `sink.*` headers are dropped and the timestamp is the time of the replay.

    Records are produced with `acks=all` and committed to `group` only once acknowledged, so a
    second run re-sends nothing (an interrupted one may re-send its last chunk). Returns the
    count per (target topic, reason); a dry run produces and commits nothing.
    """
    consumer = Consumer({**client_config, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    producer = None if dry_run else Producer(producer_config(client_config))
    try:
        todo = _replay_positions(consumer, dlq)
        consumer.assign([TopicPartition(dlq, p, start) for p, (start, _) in todo.items()])
        counts: Counter = Counter()
        while todo:
            chunk = [m for m in consumer.consume(REPLAY_CHUNK, timeout=1.0) if _in_range(m, todo)]
            failures: list[str] = []
            for message in chunk:
                _replay_one(message, producer, selection, to, counts, failures)
            if producer is not None and chunk:
                if producer.flush(DELIVERY_TIMEOUT_MS / 1000 + _FLUSH_MARGIN_S) or failures:
                    raise ReplayError(f"{(failures or ['not acknowledged in time'])[0]}; "
                                      "nothing of this chunk was committed")
                last: dict[int, int] = {}
                for message in chunk:
                    last[message.partition()] = message.offset() + 1
                consumer.commit(offsets=[TopicPartition(dlq, p, o) for p, o in last.items()], asynchronous=False)
        return counts
    finally:
        consumer.close()


def _replay_positions(consumer: Consumer, dlq: str) -> dict[int, tuple[int, int]]:
    """partition -> (the group's position or the earliest offset, the end now) for partitions with work."""
    topic = consumer.list_topics(dlq, timeout=30).topics.get(dlq)
    if topic is None or topic.error is not None or not topic.partitions:
        raise ReplayError(f"dead-letter topic {dlq} not found{f': {topic.error}' if topic and topic.error else ''}")
    committed = {tp.partition: tp.offset for tp in
                 consumer.committed([TopicPartition(dlq, p) for p in topic.partitions], timeout=30)}
    positions = {}
    for partition in topic.partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(dlq, partition), timeout=30)
        start = max(low, committed.get(partition, -1))
        if start < high:
            positions[partition] = (start, high)
    return positions


def _in_range(message: Message, todo: dict[int, tuple[int, int]]) -> bool:
    """Whether a consumed message is one to replay; drops partitions that reached their end."""
    partition = message.partition()
    if partition not in todo:
        return False
    _, end = todo[partition]
    error = message.error()
    if error is not None and error.code() != KafkaError._PARTITION_EOF:
        raise ReplayError(f"reading partition {partition}: {error.str()}")
    if error is None and message.offset() < end:
        if message.offset() + 1 >= end:
            todo.pop(partition)
        return True
    if message.offset() >= end:  # end-of-partition past the end (transaction markers)
        todo.pop(partition)
    return False


def _replay_one(message: Message, producer: Producer | None, selection: ReplayFilter, to: str | None,
                counts: Counter, failures: list[str]) -> None:
    headers = message.headers() or []
    named = dict(headers)
    if not selection.accepts(named):
        return
    target = to or (named.get(SOURCE_TOPIC) or b"").decode()
    where = f"dead letter partition={message.partition()} offset={message.offset()}"
    if not target:
        raise ReplayError(f"{where} has no {SOURCE_TOPIC} header; name the target with --to")
    counts[(target, (named.get(ERROR_KIND) or b"").decode())] += 1
    if producer is None:
        return

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(f"{where} to topic {target}: {error.str()}")

    producer.produce(target, value=message.value(), key=message.key(), headers=original_headers(headers),
                     on_delivery=delivered)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """`python -m sink_service.dead_letters replay --from <dlq> ...`: exit 0 done, 1 failed, 2 usage."""
    import argparse
    import os

    from sink_service.config import KAFKA_PASSTHROUGH_PREFIX, kafka_passthrough

    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m sink_service.dead_letters",
                                     description="Move dead letters back to their source topic after a fix.")
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("replay", help="produce the dead letters of a topic back to their source topic")
    cmd.add_argument("--from", dest="dlq", required=True, help="the dead-letter topic (SINK_DLQ_TOPIC)")
    cmd.add_argument("--to", help="produce here instead of each record's sink.source.topic")
    cmd.add_argument("--reason", help="only dead letters of this kind (sink.error.kind), e.g. missing_key")
    cmd.add_argument("--source-topic", help="only dead letters from this source topic")
    cmd.add_argument("--group", help="consumer group holding the replay's position (default: "
                     "<SINK_GROUP_ID>-replay-<dlq>[-reason-<kind>][-topic-<topic>])")
    cmd.add_argument("--dry-run", action="store_true", help="count what would be replayed; produce and commit nothing")
    args = parser.parse_args(argv)
    bootstrap = env.get(KAFKA_PASSTHROUGH_PREFIX + "BOOTSTRAP_SERVERS", "").strip()
    if not bootstrap:
        print("SINK_KAFKA_BOOTSTRAP_SERVERS is required (plus any SINK_KAFKA_* security settings the service uses).",
              file=sys.stderr)
        return 2
    client_config = {**kafka_passthrough(env), "bootstrap.servers": bootstrap}
    selection = ReplayFilter(args.reason, args.source_topic)
    group = args.group or replay_group(env.get("SINK_GROUP_ID") or "kafka-parquet-sink", args.dlq, selection)
    try:
        counts = replay(client_config, args.dlq, group, selection, args.to, args.dry_run)
    except (ReplayError, KafkaException) as exc:
        print(f"replay from {args.dlq} failed: {exc}", file=sys.stderr)
        return 1
    verb = "would replay" if args.dry_run else "replayed"
    for (topic, reason), count in sorted(counts.items()):
        print(f"{verb} {count} record(s) to topic={topic} reason={reason}")
    print(f"{verb} {sum(counts.values())} record(s) from {args.dlq} (group {group})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
