"""Where a partition without a committed offset starts, on a real broker (issue #38).

An unreadable commit stops the start (it never reads as "never committed"); the lookup asks about the
subscribed partitions only; a partition started without a commit is said at WARNING once and counted;
a group whose offsets expired resumes from its Delta table's transactions, gap check included; and
members of a new group started together all start where SINK_STARTING_OFFSETS says.
"""

from __future__ import annotations

import itertools
import logging
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import CommitProperties, Transaction, write_deltalake

from devkit.kafka_data import Workload, committed_offsets, create_topics, produce_orders, reset_offsets
from sink_service.kafka_source import offsets as offsets_module
from sink_service.kafka_source.offsets import (
    CommittedOffsetsUnreadable,
    FreshStart,
    KafkaOffsets,
    Subscription,
)
from sink_service.kafka_source.positions import OffsetGapError
from uploader.delta import DeltaTarget
from uploader.delta_settings import DeltaSettings

_names = itertools.count()
LOGGER = "sink_service.kafka_source.offsets"


def _topic(bootstrap: str, partitions: int, records: int) -> str:
    topic = f"start-decisions-{next(_names)}-{time.monotonic_ns()}"
    create_topics(bootstrap, {topic: partitions})
    for partition in range(partitions):
        produce_orders(bootstrap, topic, keys=records, updates=1, workload=Workload(), partition=partition,
                       key_prefix=f"p{partition}")
    return topic


def _committer(bootstrap: str, group: str, into: dict):
    """A commit callback that commits from outside the group, as the tests' stand-in for its member."""
    def commit(resolved) -> None:
        into.update(resolved)
        if resolved:
            reset_offsets(bootstrap, group, dict(resolved))
    return commit


def _delete_group(bootstrap: str, group: str) -> None:
    """What offsets.retention.minutes does to a group left without members: its offsets are gone."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client cancels its requests
    admin.delete_consumer_groups([group], request_timeout=30)[group].result(40)


def _delete_head(bootstrap: str, topic: str, partition: int, before: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result(30)


class _FaultyReader:
    """The real committed-offsets reader, with a per-partition error on the answers for `failing`."""

    def __init__(self, real, failing: tuple[str, int], times: int, code: int):
        self.real, self.failing, self.times, self.code = real, failing, times, code
        self.asked: list[list[tuple[str, int]]] = []

    def committed(self, request, timeout):
        self.asked.append([(tp.topic, tp.partition) for tp in request])
        answers = self.real.committed(request, timeout=timeout)
        if self.times <= 0:
            return answers
        self.times -= 1
        return [SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=-1001, error=KafkaError(self.code))
                if (tp.topic, tp.partition) == self.failing else tp for tp in answers]

    def poll(self, timeout):
        return self.real.poll(timeout)


def _faulty(monkeypatch, offsets: KafkaOffsets, failing: tuple[str, int], times: int) -> _FaultyReader:
    reader = _FaultyReader(offsets._committed_reader(), failing, times, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    monkeypatch.setattr(offsets, "_committed_reader", lambda: reader)
    return reader


# --- an unreadable commit -------------------------------------------------------------------------------

def test_an_unreadable_commit_stops_the_start_instead_of_starting_at_latest(bootstrap, monkeypatch):
    topic = _topic(bootstrap, partitions=2, records=30)
    elsewhere = _topic(bootstrap, partitions=3, records=1)  # a topic the group does not subscribe to
    group = f"unreadable-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 10, (topic, 1): 12})
    monkeypatch.setattr(offsets_module, "_TIMEOUT_S", 2.0)
    offsets = KafkaOffsets({"bootstrap.servers": bootstrap}, group)
    reader = _faulty(monkeypatch, offsets, (topic, 1), times=100)
    committed: dict = {}
    with pytest.raises(CommittedOffsetsUnreadable) as raised:
        offsets.resolve_start([(topic, 1)], "latest", "fail", _committer(bootstrap, group, committed),
                              subscription=Subscription((topic,)))
    message = str(raised.value)
    assert f"{topic}:1" in message and "TOPIC_AUTHORIZATION_FAILED" in message and group in message, message
    assert "SINK_STARTING_OFFSETS" in message and "ACLs" in message, message
    assert committed == {}, "nothing may be committed"
    assert committed_offsets(bootstrap, group, topic, 2) == {0: 10, 1: 12}
    assert len(reader.asked) >= 2, "asked again within the budget"
    asked = {tp for request in reader.asked for tp in request}
    assert asked == {(topic, 0), (topic, 1)}, f"asked about partitions outside the subscription: {asked}"
    assert not any(t == elsewhere for t, _ in asked)


def test_a_commit_unreadable_for_a_moment_is_asked_again(bootstrap, monkeypatch):
    topic = _topic(bootstrap, partitions=1, records=30)
    group = f"unreadable-once-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 7})
    offsets = KafkaOffsets({"bootstrap.servers": bootstrap}, group)
    _faulty(monkeypatch, offsets, (topic, 0), times=1)
    positions = offsets.resolve_start([(topic, 0)], "latest", "fail", _committer(bootstrap, group, {}))
    assert positions == {(topic, 0): 7}


# --- a start without a committed offset is said and counted ---------------------------------------------

def test_expired_offsets_are_said_at_warning_once_and_counted(bootstrap, caplog):
    topic = _topic(bootstrap, partitions=2, records=40)
    group = f"expired-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 20, (topic, 1): 25})
    _delete_group(bootstrap, group)
    produce_orders(bootstrap, topic, keys=10, updates=1, workload=Workload(), partition=0, key_prefix="later")
    offsets = KafkaOffsets({"bootstrap.servers": bootstrap}, group)
    counted: list[FreshStart] = []
    tps = [(topic, 0), (topic, 1)]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        positions = offsets.resolve_start(tps, "latest", "fail", _committer(bootstrap, group, {}),
                                          on_fresh=counted.extend)
    assert positions == {(topic, 0): 50, (topic, 1): 40}
    # One line for the topic's partitions that start alike, naming each one's offset.
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, lines
    [line] = lines
    assert f"topic={topic} partitions=0-1 (2): no committed offset in consumer group {group}:" in line, line
    assert "offsets.retention.minutes" in line and "a new group" in line and "SINK_STARTING_OFFSETS=latest" in line
    assert line.endswith("offsets (partition:offset) 0:50 1:40"), line
    assert sorted((s.tp, s.offset, s.source) for s in counted) == [((topic, 0), 50, "first_start"),
                                                                   ((topic, 1), 40, "first_start")]
    caplog.clear()
    _delete_group(bootstrap, group)  # the same process starts its query again: said once, counted once
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        offsets.resolve_start(tps, "earliest", "fail", _committer(bootstrap, group, {}), on_fresh=counted.extend)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(counted) == 2


def test_a_partition_found_later_is_said_at_warning_with_its_earliest_start(bootstrap, caplog):
    topic = _topic(bootstrap, partitions=2, records=30)
    group = f"found-later-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 30})
    counted: list[FreshStart] = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        positions = KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
            [(topic, 0), (topic, 1)], "latest", "fail", _committer(bootstrap, group, {}), on_fresh=counted.extend)
    assert positions == {(topic, 0): 30, (topic, 1): 0}
    line = next(r.getMessage() for r in caplog.records if f"topic={topic} partition=1:" in r.getMessage())
    assert "created or first matched after the group's first start" in line and "offset 0" in line, line
    assert [(s.tp, s.source) for s in counted] == [((topic, 1), "found_later")]


# --- a Delta table's position when Kafka has none ---------------------------------------------------------

def _table_covering(tmp_path, group: str, topic: str, covered: dict[int, int]) -> DeltaTarget:
    """A Delta table whose application transactions say it holds offsets below `covered[partition]`."""
    settings = DeltaSettings(table_uri=str(tmp_path / "table"), group_id=group)
    write_deltalake(settings.uri_for(topic), pa.table({"id": pa.array([1], pa.int64())}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[
                        Transaction(settings.app_id(topic, p), end) for p, end in covered.items()]))
    target = DeltaTarget(settings)
    assert target.covered_to(topic, 0) == covered[0]
    return target


def test_a_group_without_commits_resumes_from_the_delta_tables_transactions(bootstrap, tmp_path, caplog):
    topic = _topic(bootstrap, partitions=2, records=100)
    group = f"delta-resume-{next(_names)}"
    table = _table_covering(tmp_path, group, topic, {0: 60})
    committed: dict = {}
    counted: list[FreshStart] = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        positions = KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
            [(topic, 0), (topic, 1)], "latest", "fail", _committer(bootstrap, group, committed),
            table_position=table.covered_to, on_fresh=counted.extend)
    # Partition 0 where the table stops; partition 1, never in the table, was found after the first start.
    assert positions == {(topic, 0): 60, (topic, 1): 0}
    assert committed == {(topic, 0): 60}
    assert committed_offsets(bootstrap, group, topic, 2) == {0: 60}
    line = next(r.getMessage() for r in caplog.records if f"topic={topic} partition=0:" in r.getMessage())
    assert "Delta table's position" in line and "offset 60" in line and "offsets.retention.minutes" in line, line
    assert sorted((s.tp, s.source) for s in counted) == [((topic, 0), "table"), ((topic, 1), "found_later")]


def test_a_delta_tables_position_below_the_log_start_is_a_gap(bootstrap, tmp_path, caplog):
    topic = _topic(bootstrap, partitions=1, records=100)
    group = f"delta-gap-{next(_names)}"
    table = _table_covering(tmp_path, group, topic, {0: 60})
    _delete_head(bootstrap, topic, 0, 80)  # retention removed 20 records the table never got
    offsets = KafkaOffsets({"bootstrap.servers": bootstrap}, group)
    committed: dict = {}
    with pytest.raises(OffsetGapError) as raised:
        offsets.resolve_start([(topic, 0)], "latest", "fail", _committer(bootstrap, group, committed),
                              table_position=table.covered_to)
    message = str(raised.value)
    assert f"topic={topic} partition=0" in message and "Delta table's position" in message and "60" in message
    assert "earliest available is 80" in message and "20 record(s)" in message, message
    assert committed == {} and committed_offsets(bootstrap, group, topic, 1) == {}

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        positions = offsets.resolve_start([(topic, 0)], "latest", "skip", _committer(bootstrap, group, committed),
                                          table_position=table.covered_to)
    assert positions == committed == {(topic, 0): 80}
    assert any("RECORDS LOST" in r.getMessage() and "60" in r.getMessage() for r in caplog.records)


# --- members of a new group started together --------------------------------------------------------------

def test_members_of_a_new_group_all_start_at_latest_however_their_starts_interleave(bootstrap):
    topic = _topic(bootstrap, partitions=6, records=50)
    group = f"replicas-{next(_names)}"
    members = [[(topic, 0), (topic, 1)], [(topic, 2), (topic, 3)], [(topic, 4), (topic, 5)]]
    starts: dict = {}
    for n, tps in enumerate(members):
        if n == 1:  # records arrive between the first member's start and the others'
            produce_orders(bootstrap, topic, keys=5, updates=1, workload=Workload(), partition=2, key_prefix="new")
        starts.update(KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
            tps, "latest", "fail", _committer(bootstrap, group, {}), subscription=Subscription((topic,)),
            commit_first_start=_committer(bootstrap, group, {})))
    assert starts == {(topic, p): 50 for p in range(6)}, "a partition started below the end it had at the start"
    assert committed_offsets(bootstrap, group, topic, 6) == {p: 50 for p in range(6)}


def test_members_resolving_at_the_same_moment_never_start_below_the_end(bootstrap):
    # Both see a new group before either commits: each resolves every partition, and the first one's
    # commit lands after the second's. No partition starts, or ends up committed, below the end.
    topic = _topic(bootstrap, partitions=4, records=20)
    group = f"replicas-together-{next(_names)}"
    a, b = KafkaOffsets({"bootstrap.servers": bootstrap}, group), KafkaOffsets({"bootstrap.servers": bootstrap}, group)
    held: dict = {}
    a_starts = a.resolve_start([(topic, 0), (topic, 1)], "latest", "fail", _committer(bootstrap, group, {}),
                               commit_first_start=held.update)  # not landed yet
    b_starts = b.resolve_start([(topic, 2), (topic, 3)], "latest", "fail", _committer(bootstrap, group, {}),
                               commit_first_start=_committer(bootstrap, group, {}))
    reset_offsets(bootstrap, group, held)  # a's commit lands now
    assert held == {(topic, p): 20 for p in range(4)}
    assert a_starts == {(topic, 0): 20, (topic, 1): 20} and b_starts == {(topic, 2): 20, (topic, 3): 20}
    assert committed_offsets(bootstrap, group, topic, 4) == {p: 20 for p in range(4)}


def test_a_refused_first_start_commit_leaves_the_group_new(bootstrap):
    # A rebalance refuses the one commit of the first start: nothing is committed, so the next query
    # (of this member or another) still sees a new group, never partitions "found later".
    topic = _topic(bootstrap, partitions=2, records=20)
    group = f"replicas-refused-{next(_names)}"

    def refused(_resolved) -> None:
        raise CommittedOffsetsUnreadable("the broker refused the commit: REBALANCE_IN_PROGRESS")

    with pytest.raises(CommittedOffsetsUnreadable):
        KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
            [(topic, 0)], "latest", "fail", _committer(bootstrap, group, {}), commit_first_start=refused)
    assert committed_offsets(bootstrap, group, topic, 2) == {}
    starts = KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
        [(topic, 1)], "latest", "fail", _committer(bootstrap, group, {}),
        commit_first_start=_committer(bootstrap, group, {}))
    assert starts == {(topic, 1): 20}


def test_a_new_group_under_timestamp_commits_every_subscribed_partition(bootstrap):
    topic = _topic(bootstrap, partitions=3, records=10)
    group = f"replicas-time-{next(_names)}"
    mine: dict = {}
    others: dict = {}
    positions = KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
        [(topic, 0)], "timestamp:2099-01-01T00:00:00Z", "fail", _committer(bootstrap, group, mine),
        commit_first_start=_committer(bootstrap, group, others))
    assert positions == {(topic, 0): 10}
    assert mine == {} and others == {(topic, p): 10 for p in range(3)}, "one commit for every partition"
    later = KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
        [(topic, 1), (topic, 2)], "timestamp:2099-01-01T00:00:00Z", "fail", _committer(bootstrap, group, {}))
    assert later == {(topic, 1): 10, (topic, 2): 10}
