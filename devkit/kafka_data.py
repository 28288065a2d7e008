"""Sample workloads: keyed JSON order events with several updates per key, and their expected state."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from sink_service.kafka_source.offsets import KafkaOffsets


def create_topics(bootstrap: str, topics: dict[str, int], config: dict[str, str] | None = None) -> None:
    """Create the topics (name: partitions), each with the topic `config` given, and wait for their metadata."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, n, 1, config=config or {}) for t, n in topics.items()],
                                  operation_timeout=10)
    for future in futures.values():
        future.result()
    _wait_for_metadata(admin, topics)


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    """Grow a topic to `total` partitions and wait until its metadata shows them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result()
    _wait_for_metadata(admin, {topic: total})


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete a topic and create it again, empty: its logs restart at offset 0 (group offsets stay)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result()
    _wait_for_metadata(admin, {topic: 0})
    create_topics(bootstrap, {topic: partitions})


def _wait_for_metadata(admin: AdminClient, topics: dict[str, int]) -> None:
    """Wait until every topic shows its partition count; 0 means: until the topic is gone."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        metadata = admin.list_topics(timeout=5).topics
        if all(len(metadata[t].partitions) == n if t in metadata else n == 0 for t, n in topics.items()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"topics {topics} not visible")


@dataclass
class Workload:
    """What was produced, so tests can compute what the endpoint must end up holding."""

    latest: dict[tuple[str, str], dict] = field(default_factory=dict)  # (topic, id) -> value
    produced: int = 0

    def expected_rows(self, topic: str) -> dict[str, dict]:
        return {key: value for (t, key), value in self.latest.items() if t == topic}


def produce_orders(
    bootstrap: str,
    topic: str,
    *,
    keys: int,
    updates: int,
    workload: Workload,
    seed: int = 7,
    partition: int | None = None,
    key_prefix: str = "order",
    serialize: Callable[[dict, str], bytes] | None = None,
) -> int:
    """Produce `keys * updates` order events; each key's updates go to one partition, in order.

    `serialize(value, topic)`: the value's bytes (default: JSON), e.g. Avro for the demo's `--format avro`."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": False})
    events = [(f"{key_prefix}-{k}", version) for version in range(updates) for k in range(keys)]
    statuses = ("NEW", "PAID", "PACKED", "SHIPPED", "DELIVERED")
    for n, (key, version) in enumerate(events):
        value = {
            "id": key,
            "version": version,
            "status": statuses[version % len(statuses)],
            "amount": round(rng.uniform(1, 500), 2),
            "customer": f"customer-{rng.randrange(1000)}",
            "note": "x" * rng.randrange(0, 40),
        }
        kwargs = {"partition": partition} if partition is not None else {}
        encoded = json.dumps(value).encode() if serialize is None else serialize(value, topic)
        producer.produce(topic, key=key.encode(), value=encoded, **kwargs)
        workload.latest[(topic, key)] = value
        if n % 5000 == 0:
            producer.poll(0)
    producer.flush(30)
    workload.produced += len(events)
    return len(events)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    offsets = KafkaOffsets({"bootstrap.servers": bootstrap}, "unused")
    return {p: o for (_, p), o in offsets.latest([(topic, p) for p in range(partitions)]).items()}


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    offsets = KafkaOffsets({"bootstrap.servers": bootstrap}, group)
    return {p: o for (_, p), o in offsets.committed([(topic, p) for p in range(partitions)]).items()}


def reset_offsets(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit offsets for a group from outside it, as an operator's Kafka tooling does; raises if refused."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
    result = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, request)])[group].result()
    errors = [tp for tp in result.topic_partitions if tp.error is not None]
    if errors:
        raise KafkaException(f"commit refused for {errors}")


__all__ = [
    "TopicPartition", "Workload", "add_partitions", "committed_offsets", "create_topics", "end_offsets",
    "produce_orders", "recreate_topic", "reset_offsets",
]
