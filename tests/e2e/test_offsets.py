"""Where the service starts and what it discovers: topic patterns, new partitions, retention gaps."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from devkit.kafka_data import Workload, committed_offsets, create_topics, produce_orders, reset_offsets
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed, table_matches

pytestmark = pytest.mark.e2e


def test_topic_pattern_picks_up_new_topics_and_partitions(bootstrap, ems, unique, service_env, services):
    stem, group = unique("pattern"), unique("group")
    first, second = f"{stem}-a", f"{stem}-b"
    create_topics(bootstrap, {first: 1})
    workload = Workload()
    produce_orders(bootstrap, first, keys=100, updates=2, workload=workload)
    env = service_env("", group, SINK_TOPIC_PATTERN=f"{stem}-.*", SINK_TOPIC_REFRESH_INTERVAL_MS=1000)
    env.pop("SINK_TOPICS")
    service = services(env)
    wait_until(lambda: table_matches(ems, first, workload), 120, "the first topic", process=service)

    create_topics(bootstrap, {second: 2})
    produce_orders(bootstrap, second, keys=100, updates=2, workload=workload, seed=3)
    wait_until(lambda: table_matches(ems, second, workload), 60, "a topic created after start", process=service)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(first, 2)])[first].result()
    produce_orders(bootstrap, first, keys=50, updates=1, workload=workload, partition=1, key_prefix="late")
    wait_until(lambda: table_matches(ems, first, workload), 60, "a partition added after start", process=service)
    wait_until(lambda: all_committed(bootstrap, group, first, 2) and all_committed(bootstrap, group, second, 2),
               60, "commits", process=service)
    assert service.terminate() == 0


def _topic_with_deleted_head(bootstrap: str, topic: str, group: str) -> None:
    """100 records, the group committed at 10, then retention deletes everything below 50."""
    create_topics(bootstrap, {topic: 1})
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(100):
        producer.produce(topic, key=str(n).encode(), value=json.dumps({"id": str(n), "version": n}).encode())
    producer.flush(10)
    reset_offsets(bootstrap, group, {(topic, 0): 10})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(topic, 0, 50)])[TopicPartition(topic, 0, 50)].result()


def test_retention_gap_fails_fast_by_default(bootstrap, ems, unique, service_env, services):
    topic, group = unique("gap"), unique("group")
    _topic_with_deleted_head(bootstrap, topic, group)
    service = services(service_env(topic, group))
    assert service.wait(120) == 3
    output = service.output()
    assert f"topic={topic} partition=0: committed offset 10 but the earliest available is 50" in output
    assert "40 record(s) were deleted" in output and "SINK_RETENTION_GAP_POLICY=skip" in output
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 10}, "nothing may be skipped silently"
    assert ems.uploads(topic) == []


def test_retention_gap_skip_is_explicit_and_loud(bootstrap, ems, unique, service_env, services):
    topic, group = unique("gapskip"), unique("group")
    _topic_with_deleted_head(bootstrap, topic, group)
    service = services(service_env(topic, group, SINK_RETENTION_GAP_POLICY="skip"))
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), 120, "commits after skipping", process=service)
    assert service.terminate() == 0
    assert "RECORDS LOST" in service.output()
    assert sorted(int(r["id"]) for r in ems.table(topic)) == list(range(50, 100))


def test_an_offset_reset_while_running_is_refused_or_followed_never_overwritten(
        bootstrap, ems, unique, service_env, services):
    topic, group = unique("reset"), unique("group")
    create_topics(bootstrap, {topic: 1})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=300, updates=1, workload=workload)
    service = services(service_env(topic, group, SINK_FLUSH_RECORDS=100))
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), 60, "the first commits", process=service)
    first_uploads = len(ems.uploads(topic))
    # An operator rewinds the group with Kafka tooling while the service runs, then data arrives.
    # The service is an active group member: a broker refuses the reset (noida-db does, with
    # UNKNOWN_MEMBER_ID); one that accepts it must see it followed.
    try:
        reset_offsets(bootstrap, group, {(topic, 0): 0})
        refused = False
    except KafkaException as exc:
        assert "UNKNOWN_MEMBER_ID" in str(exc) or "NON_EMPTY_GROUP" in str(exc), exc
        refused = True
    produce_orders(bootstrap, topic, keys=300, updates=1, workload=workload, seed=5, key_prefix="later")
    wait_until(lambda: all_committed(bootstrap, group, topic, 1) and table_matches(ems, topic, workload), 60,
               "delivery after the reset attempt", process=service)
    assert service.terminate() == 0
    replayed = [u for u in ems.uploads(topic)[first_uploads:] if "_firstOffset-0_" in u["fileName"]]
    if refused:
        assert committed_offsets(bootstrap, group, topic, 1) == {0: 600} and not replayed
    else:
        assert "committed offset moved from 300 to 0 outside this service" in service.output()
        assert replayed, "the records from the reset position on were not delivered again"
