"""Dead letters: bad records produced, unchanged, to `SINK_DLQ_TOPIC` under `SINK_ERROR_POLICY=dlq`.

Executor side: a range's bad records are produced as they are found, by one idempotent
`acks=all` producer per Python worker, and `DeadLetters.settle` flushes them before the range's
committable offset moves past them. What a refusal means decides what happens (`refusal`):

- an unreachable broker or a timeout stops the range there, as an outage: nothing past the
  dead letter is committed until a replay gets it through;
- a refusal no replay can change (not authorised, no such topic, a name the broker refuses, a
  keyless record to a compacted topic) stops the service, naming `SINK_DLQ_TOPIC`;
- a dead letter larger than the topic or the producer takes is sent again alone (the broker
  refuses a whole batch that is too large), then with its value (and key, and original headers,
  if need be) cut until it fits, marked `sink.truncated=true` with the original sizes. It is
  still dead-lettered; its original stays at `sink.source.*` in the source topic.

Each dead letter carries the original key, value and headers (order and repeats kept) and the
`sink.*` headers below; its own timestamp is the time it was produced, so the dead-letter topic's
retention counts from then. A replay of the range produces its dead letters again (at least once).

`python -m sink_service.dead_letters replay` moves dead letters back to their source topic after
a fix (see `replay`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from sink_service.decode.bad_records import BadRecord
from sink_service.shared.kafka_access import AccessWatch, KafkaAccessRefused, new_client

log = logging.getLogger(__name__)

HEADER_PREFIX = "sink."
ERROR_KIND = "sink.error.kind"  # the bad record's kind, as in sink_bad_records_total{reason}
ERROR_MESSAGE = "sink.error.message"  # why it could not become a row
SOURCE_TOPIC = "sink.source.topic"
SOURCE_PARTITION = "sink.source.partition"  # decimal text
SOURCE_OFFSET = "sink.source.offset"  # decimal text
SOURCE_TIMESTAMP = "sink.source.timestamp"  # the source record's timestamp, ms since the epoch, decimal text
TRUNCATED = "sink.truncated"  # "true": the dead letter was cut to fit the topic; never replayed
ORIGINAL_KEY_BYTES = "sink.original.key.bytes"  # of a truncated dead letter, decimal text
ORIGINAL_VALUE_BYTES = "sink.original.value.bytes"
ORIGINAL_HEADERS_DROPPED = "sink.original.headers.dropped"  # how many original headers were left out
MAX_MESSAGE_BYTES = 4096  # of the error message header: enough to act on, never a second copy of the record
# How long one dead letter may take to be acknowledged: a broker or topic problem then fails the
# range (replayed with backoff) instead of holding the task for librdkafka's default 5 minutes.
DELIVERY_TIMEOUT_MS = 30_000
# How long a topic the broker says does not exist may take to appear (a topic just created): then
# the refusal is UNKNOWN_TOPIC_OR_PART, well before the delivery timeout, not a bare timeout.
TOPIC_PROPAGATION_MS = 10_000
_FLUSH_MARGIN_S = 5.0
_TOO_LARGE = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}

# (client settings as sorted pairs) -> producer: one per Python worker, reused across tasks.
_producers: dict[Hashable, Producer] = {}
_access: dict[Hashable, AccessWatch] = {}


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
        "topic.metadata.propagation.max.ms": TOPIC_PROPAGATION_MS,
        "linger.ms": 5,
        # Bad records are rare; a flood of them waits for acknowledgements rather than filling
        # memory (librdkafka's default queue holds up to 1 GB).
        "queue.buffering.max.kbytes": 65_536,
    }


def _producer(spec: DeadLetterSpec) -> Producer:
    producer = _producers.get(spec.client_config)
    if producer is None:
        # Its error callback: a refused login or certificate ends the range at once (see `access`).
        watch = _access[spec.client_config] = AccessWatch()
        producer = _producers[spec.client_config] = new_client(Producer,
            {**producer_config(dict(spec.client_config)), "error_cb": watch})
    return producer


def _flush(producer: Producer, spec: DeadLetterSpec) -> None:
    """Wait for the acknowledgements in steps; KafkaAccessRefused as soon as the login is refused."""
    deadline = time.monotonic() + DELIVERY_TIMEOUT_MS / 1000 + _FLUSH_MARGIN_S
    while producer.flush(min(0.5, max(0.0, deadline - time.monotonic()))) > 0 and time.monotonic() < deadline:
        watch = _access.get(spec.client_config)
        if watch is not None and watch.refused is not None:
            _discard_producer(spec)
            watch.check()


def _discard_producer(spec: DeadLetterSpec) -> None:
    """After a failure: what is still queued must not arrive later, and an idempotent producer that
    hit an error may be unusable, so the next range starts with a new one."""
    _access.pop(spec.client_config, None)
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


class DeadLetterRefused(DeadLetterError):
    """The dead-letter topic refuses for a reason no replay changes: the service must stop."""


def refusal(error: KafkaError, topic: str, *, has_key: bool) -> str | None:
    """Why `topic` will never take this dead letter, with what to fix; None if a retry may succeed
    (an unreachable broker, a timeout, a leader moving) or the size is at fault (see `_TOO_LARGE`)."""
    code = error.code()
    where = f"the dead-letter topic {topic} (SINK_DLQ_TOPIC)"
    if code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED):
        return (f"{where} refused this service's principal ({error.str()}): grant it Write on the topic "
                "(and IdempotentWrite on the cluster), or set SINK_DLQ_TOPIC to a topic it may write")
    if code == KafkaError.TOPIC_EXCEPTION:
        return (f"the broker refuses the name of {where} ({error.str()}): set SINK_DLQ_TOPIC to a valid "
                "topic name (at most 249 characters of a-z, A-Z, 0-9, '.', '_', '-')")
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION):
        return (f"{where} does not exist and the broker does not create it ({error.str()}): create it, "
                "or set SINK_DLQ_TOPIC to an existing topic")
    if code == KafkaError.INVALID_RECORD:
        hint = ("a record without a key: a compacted topic (cleanup.policy=compact) takes only keyed records; "
                "give SINK_DLQ_TOPIC cleanup.policy=delete" if not has_key else
                "check SINK_DLQ_TOPIC's configuration (cleanup.policy, message.timestamp.*)")
        return f"{where} refused the record as invalid ({error.str()}): {hint}"
    return None


@dataclass(frozen=True)
class _Letter:
    """A dead letter as first produced, kept until acknowledged: a size refusal sends it again."""

    record: BadRecord
    key: bytes | None
    value: bytes | None
    original: list[tuple[str, bytes | None]]  # the source record's headers
    sink: list[tuple[str, bytes]]  # the sink.* headers

    def cut(self, budget: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
        """Key, value and headers whose key, value and original headers take at most `budget` bytes:
        the value is cut first, then the key, and the original headers are dropped last."""
        key, value, original = self.key or b"", self.value or b"", self.original
        headers_size = sum(len(name.encode()) + len(v or b"") for name, v in original)
        dropped = 0
        if len(key) + headers_size > budget:
            if headers_size > budget:
                original, dropped, headers_size = [], len(original), 0
            key = key[:max(0, budget - headers_size)]
        value = value[:max(0, budget - len(key) - headers_size)]
        marks = [(TRUNCATED, b"true"), (ORIGINAL_KEY_BYTES, str(len(self.key or b"")).encode()),
                 (ORIGINAL_VALUE_BYTES, str(len(self.value or b"")).encode())]
        if dropped:
            marks.append((ORIGINAL_HEADERS_DROPPED, str(dropped).encode()))
        return (None if self.key is None else key, None if self.value is None else value,
                [*original, *self.sink, *marks])

    @property
    def size(self) -> int:
        return (len(self.key or b"") + len(self.value or b"")
                + sum(len(name.encode()) + len(v or b"") for name, v in self.original))


@dataclass
class DeadLetters:
    """One range's dead letters: produced as found, acknowledged before its offsets are committed."""

    spec: DeadLetterSpec
    acknowledged: Counter = field(default_factory=Counter)  # kind -> dead letters acknowledged
    _sent: set[int] = field(default_factory=set)  # offsets produced in this range (a rewind reads them again)
    _unacknowledged: dict[int, str] = field(default_factory=dict)  # offset -> kind
    _failures: dict[int, str] = field(default_factory=dict)  # offset -> why it was not acknowledged
    _refused: set[int] = field(default_factory=set)  # offsets of _failures no replay can fix
    _too_large: dict[int, tuple[_Letter, bool]] = field(default_factory=dict)  # offset -> (letter, sent to the broker)

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
            original = [(h["key"], h["value"]) for h in row["headers"] or ()]
            letter = _Letter(record, row["key"], row["value"], original,
                             dead_letter_headers(record, row["timestamp_ms"], None))
            self._sent.add(record.offset)
            self._produce(producer, letter, letter.key, letter.value, [*original, *letter.sink])

    def _produce(self, producer: Producer, letter: _Letter, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]]) -> None:
        record = letter.record

        def delivered(error: KafkaError | None, _message: Message) -> None:
            kind = self._unacknowledged.pop(record.offset, None)
            if error is not None:
                self._failed(letter, error, sent=True)
            elif kind is not None:
                self.acknowledged[kind] += 1

        self._unacknowledged[record.offset] = record.kind
        while True:
            try:
                producer.produce(self.spec.topic, value=value, key=key, headers=headers, on_delivery=delivered)
                return
            except BufferError:  # the queue is full: wait for acknowledgements to make room
                if producer.flush(DELIVERY_TIMEOUT_MS / 1000 + _FLUSH_MARGIN_S) > 0:
                    self._unacknowledged.pop(record.offset, None)
                    self._failures[record.offset] = f"{record.describe()}: the producer's queue stayed full"
                    return
            except KafkaException as exc:  # refused before sending, e.g. larger than message.max.bytes
                self._unacknowledged.pop(record.offset, None)
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else KafkaError(
                    KafkaError._FAIL, str(exc))
                self._failed(letter, error, sent=False)
                return

    def _failed(self, letter: _Letter, error: KafkaError, *, sent: bool) -> None:
        offset = letter.record.offset
        if error.code() in _TOO_LARGE:
            self._too_large[offset] = (letter, sent)
            return
        why = refusal(error, self.spec.topic, has_key=letter.key is not None)
        self._failures[offset] = f"{letter.record.describe()}: {why or error.str()}"
        if why is not None:
            self._refused.add(offset)

    def _send_too_large(self, producer: Producer) -> None:
        """Each dead letter refused for its size, alone: unchanged if only its batch was too large,
        then cut to half its size, a quarter, ... until it is taken or nothing is left to cut."""
        todo, self._too_large = self._too_large, {}
        for offset, (letter, sent) in sorted(todo.items()):
            budget = letter.size
            attempt = (letter.key, letter.value, [*letter.original, *letter.sink]) if sent else letter.cut(budget // 2)
            while True:
                if not sent:
                    budget //= 2
                self._produce(producer, letter, *attempt)
                producer.flush(DELIVERY_TIMEOUT_MS / 1000 + _FLUSH_MARGIN_S)
                if offset not in self._too_large:  # taken, or failed for another reason
                    break
                self._too_large.pop(offset)
                if sent:
                    sent = False
                    attempt = letter.cut(budget // 2)
                    continue
                if budget == 0:
                    self._failures[offset] = (
                        f"{letter.record.describe()}: the dead-letter topic {self.spec.topic} (SINK_DLQ_TOPIC) "
                        "refuses it for its size even with no key, value or original headers left: raise its "
                        "max.message.bytes (and the producer's SINK_KAFKA_MESSAGE_MAX_BYTES)")
                    self._refused.add(offset)
                    break
                attempt = letter.cut(budget // 2)
            if offset not in self._failures and offset not in self._unacknowledged:
                log.warning("dead letter %s cut to fit the dead-letter topic %s (%d bytes of key, value and "
                            "headers were too many); marked %s=true", letter.record.describe()[:200],
                            self.spec.topic, letter.size, TRUNCATED)

    def settle(self, below: int) -> None:
        """Wait for the acknowledgements; raise if a dead letter with an offset below `below` (the
        next committable offset) is not acknowledged. Later ones are judged when that moves past them."""
        if not self._sent:
            return
        producer = _producer(self.spec)
        try:
            _flush(producer, self.spec)
        except KafkaAccessRefused:
            self._failures.clear()
            self._refused.clear()
            raise
        if self._too_large:
            self._send_too_large(producer)
        for offset in self._unacknowledged:  # left after the flush: timed out
            self._failures.setdefault(offset, f"offset={offset}: not acknowledged within {DELIVERY_TIMEOUT_MS} ms")
        blocking = sorted(offset for offset in self._failures if offset < below)
        if blocking:
            refused = [offset for offset in blocking if offset in self._refused]
            first = self._failures[(refused or blocking)[0]]
            self._failures.clear()
            self._refused.clear()
            _discard_producer(self.spec)
            if refused:
                raise DeadLetterRefused(
                    f"cannot dead-letter bad record {first}. "
                    "Replaying cannot fix this; nothing past it was committed")
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
           to: str | None = None, dry_run: bool = False, truncated: Counter | None = None) -> Counter:
    """Produce the dead letters of `dlq` past `group`'s committed offsets, up to the end of the
    topic when called, back to their source topic (or `to`) with their original key, value and
    headers; the `sink.*` headers are dropped and the timestamp is the time of the replay.

    Records are produced with `acks=all` and committed to `group` only once acknowledged, so a
    second run re-sends nothing (an interrupted one may re-send its last chunk). Returns the
    count per (target topic, reason); a dry run produces and commits nothing.

    A truncated dead letter (`sink.truncated=true`) is never produced back: it is counted in
    `truncated` per (source topic, reason), and its original is at `sink.source.*`.
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
                _replay_one(message, producer, selection, to, counts, failures, truncated)
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
                counts: Counter, failures: list[str], truncated: Counter | None = None) -> None:
    headers = message.headers() or []
    named = dict(headers)
    if not selection.accepts(named):
        return
    where = f"dead letter partition={message.partition()} offset={message.offset()}"
    if named.get(TRUNCATED) == b"true":  # producing it back would put a cut record in the source topic
        source = (named.get(SOURCE_TOPIC) or b"").decode(errors="replace")
        log.warning("%s left out: truncated to fit the dead-letter topic; the original is at topic=%s "
                    "partition=%s offset=%s", where, source, (named.get(SOURCE_PARTITION) or b"").decode(),
                    (named.get(SOURCE_OFFSET) or b"").decode())
        if truncated is not None:
            truncated[(source, (named.get(ERROR_KIND) or b"").decode())] += 1
        return
    target = to or (named.get(SOURCE_TOPIC) or b"").decode()
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
    truncated: Counter = Counter()
    try:
        counts = replay(client_config, args.dlq, group, selection, args.to, args.dry_run, truncated)
    except (ReplayError, KafkaException) as exc:
        print(f"replay from {args.dlq} failed: {exc}", file=sys.stderr)
        return 1
    verb = "would replay" if args.dry_run else "replayed"
    for (topic, reason), count in sorted(counts.items()):
        print(f"{verb} {count} record(s) to topic={topic} reason={reason}")
    print(f"{verb} {sum(counts.values())} record(s) from {args.dlq} (group {group})")
    if truncated:
        print(f"{sum(truncated.values())} truncated dead letter(s) left out (sink.truncated=true): their originals "
              "are at sink.source.topic/partition/offset in the source topic, while its retention keeps them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
