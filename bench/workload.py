"""The benchmark workload: keyed JSON order events, built in memory first, then produced as fast as possible.

Record i is version `i // keys` of key `i % keys`, so every key is updated `records / keys` times and its
versions are spread over the whole stream. Every value is padded to exactly `record_size` bytes. The Kafka
timestamp of each record is its produce time (librdkafka's CreateTime, taken when `produce()` is called).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from confluent_kafka import KafkaException, Producer

STATUSES = ("NEW", "PAID", "PACKED", "SHIPPED", "DELIVERED")
_SKELETON = '{"id":"k%07d","version":%d,"status":"%s","amount":%d.%02d,"customer":"c%04d","note":"%s"}'
MAX_VERSIONS = 1000  # the version is written with up to three digits
MIN_RECORD_SIZE = len(_SKELETON % (0, MAX_VERSIONS - 1, "DELIVERED", 499, 99, 0, ""))


@dataclass(frozen=True)
class WorkloadSpec:
    records: int = 2_000_000
    partitions: int = 8
    keys: int = 200_000
    record_size: int = 130  # bytes per JSON value

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Produced:
    topic: str
    records: int
    key_bytes: int
    value_bytes: int
    seconds: float
    end_offsets: dict[int, int]

    @property
    def payload_bytes(self) -> int:
        return self.key_bytes + self.value_bytes


def iter_records(spec: WorkloadSpec, seed: int = 7) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every record in order, made as they are asked for: the same records for one seed.

    A live run produces them while it goes (36M records for 30 minutes at 20k/s would not fit in memory up front).
    """
    if spec.record_size < MIN_RECORD_SIZE:
        raise ValueError(f"record size must be at least {MIN_RECORD_SIZE} bytes")
    if -(-spec.records // spec.keys) > MAX_VERSIONS or spec.keys > 10_000_000:
        raise ValueError(f"at most {MAX_VERSIONS} versions per key and 10,000,000 keys")
    rng = random.Random(seed)
    key_list = [b"k%07d" % k for k in range(spec.keys)]
    pad_cache: dict[int, str] = {}
    for i in range(spec.records):
        k, version = i % spec.keys, i // spec.keys
        cents = rng.randrange(100, 50_000)
        head = _SKELETON % (k, version, STATUSES[version % 5], cents // 100, cents % 100, rng.randrange(10_000), "")
        pad = spec.record_size - len(head)
        note = pad_cache.get(pad)
        if note is None:
            note = pad_cache[pad] = "x" * pad
        yield key_list[k], (head[:-2] + note + '"}').encode()


def build_records(spec: WorkloadSpec, seed: int = 7) -> tuple[list[bytes], list[bytes]]:
    """(keys, values) as bytes, built before the clock starts so producing is not bound by JSON encoding."""
    keys, values = [], []
    for key, value in iter_records(spec, seed):
        keys.append(key)
        values.append(value)
    return keys, values


@dataclass(frozen=True)
class Trailers:
    """What `produce_trailers` wrote: the true end offsets and the records it added to the topic."""

    ends: dict[int, int]
    key_bytes: int
    value_bytes: int

    @property
    def records(self) -> int:
        return len(self.ends)


def produce_trailers(bootstrap: str, topic: str, partitions: int, record_size: int) -> Trailers:
    """One more record per partition, each produced alone; returns the true end offsets.

    tansu reports a partition's high watermark as the base offset of its last batch + 1, so after a backlog
    produced in large batches its reported ends fall short (`devkit.brokers.reported_ends_need_trailers`). A last
    batch of one record makes the reported end the true end. Each trailer is a workload record of its own key
    (`t` and the partition)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    ends: dict[int, int] = {}
    errors: list[str] = []
    key_bytes = value_bytes = 0

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(f"trailer to partition {msg.partition()}: {err}")
        else:
            ends[msg.partition()] = msg.offset() + 1

    for partition in range(partitions):
        head = (_SKELETON % (partition, 0, STATUSES[0], 1, 0, 0, "")).replace('"id":"k', '"id":"t', 1)
        value = (head[:-2] + "x" * max(0, record_size - len(head)) + '"}').encode()
        key = b"t%07d" % partition
        producer.produce(topic, value, key, partition=partition, on_delivery=delivered)
        producer.flush(30)  # one batch per trailer: its base offset is its own offset
        key_bytes, value_bytes = key_bytes + len(key), value_bytes + len(value)
    if errors or len(ends) != partitions:
        raise KafkaException(f"trailers not acknowledged: {errors or sorted(set(range(partitions)) - set(ends))}")
    return Trailers(ends, key_bytes, value_bytes)


class AckedProducer:
    """A producer whose every record is acknowledged by all replicas; keeps the first delivery errors."""

    def __init__(self, bootstrap: str, **tuning: object):
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            "enable.idempotence": False,
            "acks": "all",
            **tuning,
        })
        self.errors: list[str] = []

    def send(self, topic: str, key: bytes, value: bytes, backoff_s: float) -> None:
        """Produce one record; while librdkafka's queue is full, serve deliveries for backoff_s and try again."""
        while True:
            try:
                self.producer.produce(topic, value, key, on_delivery=self.delivered)
                return
            except BufferError:
                self.producer.poll(backoff_s)

    def delivered(self, err, _msg) -> None:
        if err is not None and len(self.errors) < 10:
            self.errors.append(str(err))

    def settle(self, timeout_s: float = 120) -> None:
        """Wait for every acknowledgement; raises if any record was not acknowledged."""
        remaining = self.producer.flush(timeout_s)
        if remaining or self.errors:
            raise KafkaException(f"{remaining} record(s) not acknowledged; errors: {self.errors}")


def produce(bootstrap: str, topic: str, keys: list[bytes], values: list[bytes]) -> float:
    """Produce all records (partitioned by key) and wait until every one is acknowledged; returns seconds."""
    acked = AckedProducer(bootstrap, **{"linger.ms": 50, "batch.size": 1_000_000, "batch.num.messages": 100_000})
    started = time.perf_counter()
    for n, (key, value) in enumerate(zip(keys, values, strict=True)):
        acked.send(topic, key, value, 0.05)
        if n % 20_000 == 0:
            acked.producer.poll(0)
    acked.settle(300)
    return time.perf_counter() - started
