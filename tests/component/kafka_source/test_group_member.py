"""The driver's group member against a real broker: it holds partitions and never reads them."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer

from devkit.kafka_data import Workload, committed_offsets, create_topics, produce_orders, reset_offsets
from sink_service.kafka_source.membership import CommitRefused, GroupMembership


def test_the_member_fetches_no_records_from_the_partitions_it_holds(bootstrap):
    # Executors read; the member only holds the partitions, from the group's committed positions
    # (the service commits its start positions first). A fetch would bring records nobody reads:
    # noida-db sends a partition's whole backlog in one answer, a real broker up to fetch.max.bytes.
    topic = f"member-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {topic: 4})
    produce_orders(bootstrap, topic, keys=2000, updates=5, workload=Workload())
    reset_offsets(bootstrap, f"group-{topic}", {(topic, p): 0 for p in range(4)})
    received: list[int] = []

    def stats(text: str) -> None:
        received.append(json.loads(text)["rxmsg_bytes"])  # record bytes fetched from any broker

    member = GroupMembership({"bootstrap.servers": bootstrap, "statistics.interval.ms": 100, "stats_cb": stats},
                             f"group-{topic}", [topic], 30_000, lambda: True, 10, f"instance-{topic}")
    member.start()
    try:
        assert member.wait_assignment(30) is not None
        time.sleep(2)  # a fetch in flight at the assignment would have been answered by now
        assert received, "no statistics from the member's consumer"
        assert received[-1] == 0, f"the member fetched {received[-1]:,} bytes of records it never reads"
    finally:
        member.close()


def test_a_fenced_member_rejoins_with_a_new_consumer(bootstrap):
    # A broker stall can expire the member's session; its rejoin under the same group.instance.id
    # then fences a request still in flight, a fatal error that ends the librdkafka client for good
    # (seen in a broker-pause test: the instance held nothing and was never ready again). Another
    # client joining under the same instance id causes the same fencing on demand.
    topic = f"fenced-{uuid.uuid4().hex[:8]}"
    group, instance = f"group-{topic}", f"instance-{topic}"
    create_topics(bootstrap, {topic: 2})
    member = GroupMembership({"bootstrap.servers": bootstrap}, group, [topic], 30_000, lambda: True, 10, instance)
    member.start()
    try:
        _assigned, first_epoch = member.wait_assignment(30)
        intruder = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance,
                             "session.timeout.ms": 10_000, "enable.auto.commit": False})
        intruder.subscribe([topic])
        deadline = time.monotonic() + 30
        while not intruder.assignment() and time.monotonic() < deadline:
            intruder.poll(0.2)
        assert intruder.assignment(), "the second client under the same instance id got no partitions"
        intruder.close()  # a static member does not leave: the group keeps its place for the instance
        again = None
        while again is None and time.monotonic() < deadline + 30:
            settled = member.wait_assignment(1)
            if settled is not None and settled[1] > first_epoch:
                again = settled
        assert again is not None, "the fenced member never held the partitions again"
        assert again[0] == {(topic, 0), (topic, 1)}
        member.commit({(topic, 0): 0, (topic, 1): 0}, again[1])  # the new client's commits are accepted
    finally:
        member.close()


def test_a_session_that_expires_gives_up_the_assignment_without_waiting_for_the_batch(own_broker):
    # The broker stops answering for longer than the session timeout: the group hands the partitions
    # to another member. The batch in flight (never idle here) must not be waited for: its uploads
    # would overlap the new owner's. The service restarts its query when the epoch moves.
    topic = f"lost-{uuid.uuid4().hex[:8]}"
    create_topics(own_broker.bootstrap, {topic: 2})
    member = GroupMembership({"bootstrap.servers": own_broker.bootstrap, "session.timeout.ms": 6000,
                              "heartbeat.interval.ms": 1000}, f"group-{topic}", [topic], 30_000,
                             lambda: False, 120, f"instance-{topic}")
    member.start()
    pause = None
    try:
        settled = member.wait_assignment(30)
        assert settled is not None and settled[0] == {(topic, 0), (topic, 1)}
        epoch = settled[1]
        pause = threading.Thread(target=own_broker.pause_for, args=(15,), daemon=True)
        paused_at = time.monotonic()
        pause.start()
        while member.epoch == epoch and time.monotonic() - paused_at < 14:
            time.sleep(0.1)
        lost_after_s = time.monotonic() - paused_at
        print(f"session expiry: the assignment was given up {lost_after_s:.1f}s after the broker stopped")
        assert member.epoch != epoch, "the lost assignment still waits for the batch in flight"
        assert member.assigned is None and not member.owns(epoch)
        assert lost_after_s < 12, f"the assignment was given up {lost_after_s:.1f}s after the broker stopped"
        pause.join()
        again = member.wait_assignment(60)
        assert again is not None and again[1] > epoch, "the member did not rejoin after the broker came back"
    finally:
        if pause is not None:
            pause.join()
        member.close()


def test_a_first_start_commits_the_positions_of_partitions_other_members_own(bootstrap):
    # The group's first start commits every subscribed partition's resolved position through one member
    # (KafkaOffsets.resolve_start), so replicas started together see the same decision. The broker checks
    # the generation only; the member's own check of ownership is lifted for that commit alone.
    topic = f"first-start-{uuid.uuid4().hex[:8]}"
    owned, other = f"{topic}-owned", f"{topic}-other"
    create_topics(bootstrap, {owned: 1, other: 2})
    group = f"group-{topic}"
    member = GroupMembership({"bootstrap.servers": bootstrap}, group, [owned], 30_000, lambda: True, 10,
                             f"instance-{topic}")
    member.start()
    try:
        assigned, epoch = member.wait_assignment(30)
        assert assigned == {(owned, 0)}
        with pytest.raises(CommitRefused):  # progress for a partition not assigned
            member.commit({(other, 0): 0}, epoch)
        member.commit({(owned, 0): 0, (other, 0): 0, (other, 1): 0}, epoch, others=True)
        assert committed_offsets(bootstrap, group, other, 2) == {0: 0, 1: 0}
        assert committed_offsets(bootstrap, group, owned, 1) == {0: 0}
    finally:
        member.close()
