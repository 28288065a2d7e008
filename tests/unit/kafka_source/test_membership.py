"""Group membership bookkeeping: assignment epochs, the revoke wait, and which commits are refused."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from sink_service.kafka_source import membership
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


class ReplaceableConsumer(FakeConsumer):
    def __init__(self, _config=None):
        super().__init__()
        self.closed = False

    def subscribe(self, topics, on_assign, on_revoke, on_lost=None):
        pass

    def close(self):
        self.closed = True


def fenced_member(monkeypatch) -> tuple[GroupMembership, list[ReplaceableConsumer], list[float]]:
    group, _fake = member()
    group._consumer = ReplaceableConsumer()
    made: list[ReplaceableConsumer] = []  # the consumers made after the first
    clock = [1000.0]
    monkeypatch.setattr(membership, "Consumer", lambda config: made.append(ReplaceableConsumer(config)) or made[-1])
    monkeypatch.setattr(membership.time, "monotonic", lambda: clock[0])
    return group, made, clock


def test_a_fatal_error_replaces_the_consumer_until_fencing_repeats_then_it_gives_up_loudly(monkeypatch, caplog):
    group, made, clock = fenced_member(monkeypatch)
    for _ in range(membership.FENCED_LIMIT - 1):  # a race after a broker stall: rejoin
        group._on_fatal()
        clock[0] += 60
    assert len(made) == membership.FENCED_LIMIT - 1 and not group.gave_up
    assert all(c.closed for c in made[:-1]) and not made[-1].closed
    group._on_fatal()  # fenced again and again: another live client has the same instance id
    assert group.gave_up and len(made) == membership.FENCED_LIMIT - 1
    assert "fenced 3 times" in caplog.text and "group.instance.id" in caplog.text
    group._on_fatal()
    assert len(made) == membership.FENCED_LIMIT - 1  # no more rejoining, no more fencing of the other


def test_fatal_errors_far_apart_are_each_a_fresh_race(monkeypatch):
    group, made, clock = fenced_member(monkeypatch)
    for _ in range(2 * membership.FENCED_LIMIT):
        group._on_fatal()
        clock[0] += membership.FENCED_WINDOW_S / 2 + 1
    assert not group.gave_up and len(made) == 2 * membership.FENCED_LIMIT


def test_a_fatal_error_drops_the_assignment_even_when_librdkafka_did_not_revoke(monkeypatch):
    # Seen with two clients under one instance id: the fenced one kept its assignment, so its
    # service would have gone on planning batches it can never commit.
    group, _made, _clock = fenced_member(monkeypatch)
    group._assign(group._consumer, [TopicPartition("orders", 0)])
    group._on_fatal()
    assert group.assigned is None and not group.owns(1)


class SubscribingConsumer(FakeConsumer):
    """Keeps the rebalance callbacks the member registers, as confluent-kafka does."""

    def __init__(self):
        super().__init__()
        self.callbacks: dict[str, object] = {}

    def subscribe(self, topics, **callbacks):
        self.callbacks = callbacks

    def lose(self, partitions) -> None:
        """librdkafka's lost assignment (session expired, fenced): confluent-kafka hands it to
        on_lost, or to on_revoke when no on_lost was registered."""
        (self.callbacks.get("on_lost") or self.callbacks["on_revoke"])(self, partitions)


def test_a_lost_assignment_ends_ownership_at_once_without_waiting_for_the_batch_in_flight():
    # The broker already gave the partitions to another member: waiting for the batch would let its
    # tasks upload them alongside the new owner's for up to the revoke wait.
    group, _ = member(batch_idle=lambda: False, revoke_wait_s=30)
    fake = group._consumer = SubscribingConsumer()
    group._subscribe()
    group._assign(fake, [TopicPartition("orders", 0)])
    lost = threading.Thread(target=fake.lose, args=([TopicPartition("orders", 0)],), daemon=True)
    started = time.monotonic()
    lost.start()
    lost.join(2)
    assert not lost.is_alive(), "the lost assignment waited for the batch in flight"
    assert time.monotonic() - started < 1
    assert group.epoch == 2 and group.assigned is None and not group.owns(1)
    with pytest.raises(CommitRefused):
        commit(group, {("orders", 0): 7}, epoch=1)
    assert fake.committed == []


def test_a_fatal_error_is_a_lost_assignment_too(monkeypatch):
    # Fenced: the partitions are someone else's already, so the batch in flight is not waited for.
    group, made, _clock = fenced_member(monkeypatch)
    group._batch_idle = lambda: False
    group._revoke_wait_s = 30
    group._assign(group._consumer, [TopicPartition("orders", 0)])
    done = threading.Thread(target=group._on_fatal, daemon=True)
    done.start()
    done.join(2)
    assert not done.is_alive(), "the fatal error waited for the batch in flight"
    assert group.epoch == 2 and not group.owns(1) and len(made) == 1


class InterleavedMembership(GroupMembership):
    """Runs a hook on the calling thread right after its next read of the assignment state."""

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if name in ("epoch", "revoking", "assigned", "_state"):
            hooks = object.__getattribute__(self, "__dict__").get("_hooks")
            if hooks and hooks[0] == threading.get_ident():
                del object.__getattribute__(self, "__dict__")["_hooks"]
                hooks[1]()
        return value


def test_ownership_is_read_as_one_state_when_a_revoke_ends_between_two_reads():
    # The revoke waits for the batch to be idle; a batch that starts just after the revoke saw it idle
    # checks ownership while the revoke ends. Reading the epoch (still the old one), then `revoking`
    # (False again, the revoke is over) answered "owned" though it was owned at neither moment.
    idle = threading.Event()
    group = InterleavedMembership({"bootstrap.servers": "127.0.0.1:1"}, "g", ["orders"], 1000, idle.is_set, 10,
                                  instance_id("/scratch/instance-0"))
    fake = group._consumer = FakeConsumer()
    group._assign(fake, [TopicPartition("orders", 0)])
    revoke = threading.Thread(target=group._revoke, args=(fake, [TopicPartition("orders", 0)]), daemon=True)
    revoke.start()
    deadline = time.monotonic() + 5
    while not group.revoking and time.monotonic() < deadline:
        time.sleep(0.01)
    assert group.revoking

    def revoke_ends() -> None:
        idle.set()
        revoke.join(5)
        assert group.epoch == 2 and not group.revoking

    group.__dict__["_hooks"] = (threading.get_ident(), revoke_ends)
    assert not group.owns(1), "the batch was let run on a revoked assignment"
    assert "_hooks" not in group.__dict__, "the hook never ran: the test proves nothing"


def test_waiting_for_an_assignment_reads_one_state():
    group = InterleavedMembership({"bootstrap.servers": "127.0.0.1:1"}, "g", ["orders"], 1000, lambda: True, 10,
                                  instance_id("/scratch/instance-0"))
    fake = group._consumer = FakeConsumer()
    group._assign(fake, [TopicPartition("orders", 0)])
    # A revoke and a new assignment land between the reads: the answer pairs one assignment with its own epoch.
    group.__dict__["_hooks"] = (threading.get_ident(), lambda: (group._revoke(fake, [TopicPartition("orders", 0)]),
                                                               group._assign(fake, [TopicPartition("orders", 1)])))
    assigned, epoch = group.wait_assignment(1)
    assert (assigned, epoch) in ((frozenset({("orders", 0)}), 1), (frozenset({("orders", 1)}), 3))


class DyingConsumer(FakeConsumer):
    def subscribe(self, topics, **callbacks):
        pass

    def poll(self, timeout):
        raise RuntimeError("injected: the member thread's consumer call failed")

    def close(self):
        pass


def test_a_member_thread_that_dies_says_so_and_gives_up_its_partitions_and_commits_at_once(caplog):
    # With an override like cooperative-sticky the member's callback raised out of poll(): the thread
    # ended without a word, and every commit then waited its 30 s for an answer that never came.
    group, _ = member()
    group._consumer = DyingConsumer()
    group._assign(group._consumer, [TopicPartition("orders", 0)])
    group.start()
    group._thread.join(5)
    assert not group._thread.is_alive()
    assert group.failure is not None and "injected" in group.failure
    assert "injected" in caplog.text
    assert group.epoch == 2 and not group.owns(1)
    started = time.monotonic()
    with pytest.raises(CommitRefused, match="injected"):
        group.commit({("orders", 0): 5}, epoch=2)
    assert time.monotonic() - started < 2
    assert group.wait_assignment(5) is None
    assert time.monotonic() - started < 2
