"""Kafka source settings (SINK_KAFKA_*, topics, group, positions) and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from sink_service.config.declare import setting
from sink_service.shared.instants import starting_time_ms

KAFKA_PASSTHROUGH_PREFIX = "SINK_KAFKA_"
_SECRET_WORDS = ("PASSWORD", "SECRET", "TOKEN", "CREDENTIAL")
# librdkafka settings the service sets itself, and why a SINK_KAFKA_* override is refused at startup
# (e.g. cooperative-sticky made the group member's eager assign raise: no commit was answered again).
RESERVED_KAFKA_OPTIONS = {
    "bootstrap.servers": "it comes from SINK_KAFKA_BOOTSTRAP_SERVERS",
    "group.id": "it comes from SINK_GROUP_ID",
    "enable.auto.commit": "offsets are committed only after their files were uploaded",
    "enable.auto.offset.store": "offsets are committed only after their files were uploaded",
    "partition.assignment.strategy": "the group member assigns eagerly (a rebalance revokes everything and "
                                     "the query restarts on the new assignment); cooperative assignors are "
                                     "not supported",
    "group.protocol": "the group member uses the classic protocol, whose eager rebalances and static "
                      "membership it depends on",
    "group.instance.id": "each instance derives its own from its host name and SINK_SCRATCH_DIR; one id "
                         "shared by two instances makes the broker fence them in turn",
    "isolation.level": "reads are read_committed and offset ranges end at the last stable offset",
}
_SENSITIVE_KAFKA_OPTIONS = frozenset({
    "ssl.key.pem", "ssl.certificate.pem", "ssl.keystore.password", "ssl.key.password",
    "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret", "sasl.password",
})


@dataclass(frozen=True)
class KafkaSettings:
    """Kafka source settings: part of `SinkConfig`."""

    kafka_bootstrap_servers: str = setting(
        "SINK_KAFKA_BOOTSTRAP_SERVERS", "Kafka bootstrap servers, `host:port[,host:port]`. Required.",
        group="Kafka")
    topics: tuple[str, ...] = setting(
        "SINK_TOPICS", "Comma-separated topics to consume. Set this or `SINK_TOPIC_PATTERN`.", (),
        group="Kafka")
    topic_pattern: str | None = setting(
        "SINK_TOPIC_PATTERN",
        "Regular expression matched against whole topic names; new matching topics and partitions "
        "are picked up without a restart. Set this or `SINK_TOPICS`.", group="Kafka")
    group_id: str = setting(
        "SINK_GROUP_ID", "Consumer group whose committed offsets are the service's only progress "
        "record. Lag is visible to standard Kafka tooling under this name.", "kafka-parquet-sink",
        group="Kafka")
    starting_offsets: str = setting(
        "SINK_STARTING_OFFSETS", "Where partitions without a committed offset start at the consumer "
        "group's first start, while the group has committed nothing yet: `earliest`, `latest`, or "
        "`timestamp:<ISO-8601 time with UTC offset>` (e.g. `timestamp:2026-11-24T14:00:00Z`) for the "
        "first record at or after that time, found with Kafka's offsets-for-times: a time after a "
        "partition's last record starts it at its log end, a time before its log start at its earliest "
        "offset (logged). A `latest` or `timestamp:` position is committed at once, so replays and "
        "restarts keep it. Once the group has committed, every partition without a commit (a topic or "
        "partition created or matched later, found while running or while the service was down) "
        "starts at its earliest offset, whichever process finds it. The first replica to start a new "
        "group commits every subscribed partition's position, so replicas started together all start "
        "here. A group without commits writing to a Delta table resumes at the table's own progress (its "
        "application transactions) instead. To move a stopped group that has committed, use "
        "`sink-service offsets`.",
        "earliest", group="Kafka")
    retention_gap_policy: str = setting(
        "SINK_RETENTION_GAP_POLICY",
        "What to do when a committed offset lies outside the log: fallen out of retention, or beyond "
        "the log end (truncation, a topic deleted and recreated). `fail` stops with exit 3 and commits "
        "nothing; `skip` restarts the partition at its earliest available offset and logs `RECORDS LOST`.",
        "fail", choices=("fail", "skip"), group="Kafka")
    topic_refresh_interval_ms: int = setting(
        "SINK_TOPIC_REFRESH_INTERVAL_MS", "How often topic metadata is re-read to discover new "
        "topics (pattern) and partitions.", 30_000, minimum=1000, group="Kafka")
    read_batch_max_bytes: int = setting(
        "SINK_READ_BATCH_MAX_BYTES", "Most bytes of keys and values a task reads from Kafka before it "
        "decodes and writes them; with the 20,000-record cap this bounds a task's memory whatever "
        "the record size.", 32 * 1024 * 1024, minimum=1024, group="Kafka")


def starting_offsets_problems(value: str) -> list[str]:
    """A malformed `SINK_STARTING_OFFSETS` is found at startup with every other problem, not when the
    group first starts (which may be long after a deployment, or never on a replica)."""
    try:
        starting_time_ms(value)
    except ValueError as exc:
        return [f"SINK_STARTING_OFFSETS: {exc}."]
    return []


def is_secret_kafka_option(name: str) -> bool:
    """librdkafka's sensitive properties, plus anything named like a secret."""
    normalized = name.lower().replace("_", ".")
    return normalized in _SENSITIVE_KAFKA_OPTIONS or any(word in normalized.upper() for word in _SECRET_WORDS)
