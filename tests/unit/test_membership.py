"""Group membership bookkeeping: assignment epochs, the revoke wait, and which commits are refused."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from sink_service.kafka_source.membership import CommitRefused, GroupMembership, _CommitRequest, instance_id


class FakeConsumer:
    """Records what the member asked of its consumer; the broker's answer is scripted."""

    def __init__(self):
        self.paused: list[TopicPartition] = []
        self.committed: list[list[TopicPartition]] = []
        self.refuse: KafkaError | None = None

    def assign(self, partitions):
        pass

    def pause(self, partitions):
        self.paused.extend(partitions)

    def commit(self, offsets, asynchronous):
        assert asynchronous is False
        if self.refuse is not None:
            raise KafkaException(self.refuse)
        self.committed.append(offsets)
        return offsets


def member(batch_idle=lambda: True, revoke_wait_s=1.0) -> tuple[GroupMembership, FakeConsumer]:
    group = GroupMembership({"bootstrap.servers": "127.0.0.1:1"}, "g", ["orders"], 1000, batch_idle, revoke_wait_s,
                            instance_id("/scratch/instance-0"))
    fake = FakeConsumer()
    group._consumer = fake
    return group, fake


def commit(group: GroupMembership, offsets, epoch) -> None:
    request = _CommitRequest(offsets, epoch)
    group._commit(request)


def test_assignment_pauses_the_partitions_and_counts_an_epoch():
    group, fake = member()
    group._assign(fake, [TopicPartition("orders", 0), TopicPartition("orders", 1)])
    assert group.assigned == {("orders", 0), ("orders", 1)}
    assert group.owns(1) and not group.owns(0)
    assert [(tp.topic, tp.partition) for tp in fake.paused] == [("orders", 0), ("orders", 1)]
    assert group.wait_assignment(0.1) == (frozenset({("orders", 0), ("orders", 1)}), 1)


def test_a_commit_planned_before_a_rebalance_is_refused_without_asking_the_broker():
    group, fake = member()
    group._assign(fake, [TopicPartition("orders", 0)])
    group._revoke(fake, [TopicPartition("orders", 0)])
    group._assign(fake, [TopicPartition("orders", 0)])  # same partition, new generation
    with pytest.raises(CommitRefused, match="assignment changed"):
        commit(group, {("orders", 0): 10}, epoch=1)
    assert fake.committed == []
    commit(group, {("orders", 0): 10}, epoch=3)
    assert [(tp.partition, tp.offset) for tp in fake.committed[0]] == [(0, 10)]


def test_a_commit_for_a_partition_not_assigned_is_refused():
    # The broker checks the generation only: it would accept this one.
    group, fake = member()
    group._assign(fake, [TopicPartition("orders", 0)])
    with pytest.raises(CommitRefused, match=r"\('orders', 1\)"):
        commit(group, {("orders", 0): 5, ("orders", 1): 5}, epoch=1)
    assert fake.committed == []


def test_a_broker_refusal_is_a_commit_refused():
    group, fake = member()
    group._assign(fake, [TopicPartition("orders", 0)])
    fake.refuse = KafkaError(KafkaError.ILLEGAL_GENERATION)
    with pytest.raises(CommitRefused, match="refused"):
        commit(group, {("orders", 0): 5}, epoch=1)


def test_revoke_waits_for_the_batch_and_serves_its_commit_meanwhile():
    running = threading.Event()
    running.set()
    group, fake = member(batch_idle=lambda: not running.is_set(), revoke_wait_s=10)
    group._assign(fake, [TopicPartition("orders", 0)])

    def batch() -> None:  # the batch in flight commits, then ends
        assert not group.owns(1), "no new batch may start while revoking"
        group.commit({("orders", 0): 7}, epoch=1)
        running.clear()

    threading.Timer(0.2, batch).start()
    group._revoke(fake, [TopicPartition("orders", 0)])
    assert [(tp.partition, tp.offset) for tp in fake.committed[0]] == [(0, 7)]
    assert group.assigned is None and group.epoch == 2 and not group.revoking


def test_revoke_gives_up_waiting_after_its_bound():
    group, fake = member(batch_idle=lambda: False, revoke_wait_s=0.2)
    group._assign(fake, [TopicPartition("orders", 0)])
    group._revoke(fake, [TopicPartition("orders", 0)])
    assert group.assigned is None
    with pytest.raises(CommitRefused):
        commit(group, {("orders", 0): 7}, epoch=1)


def test_waiting_for_an_assignment_ends_when_the_service_stops():
    group, _ = member()
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert group.wait_assignment(30, stop=stop) is None
    assert time.monotonic() - started < 5
