"""Where partitions without a committed offset start, decided from the group's commits on a real broker.

`SINK_STARTING_OFFSETS` belongs to the group's first start. A process that starts later (a restart,
a rolling update, another replica) must take a partition without a commit for one created since, and
read it from its earliest offset, whatever that process itself has seen.
"""

from __future__ import annotations

import itertools

from devkit.kafka_data import Workload, create_topics, produce_orders, reset_offsets
from sink_service.kafka_source.offsets import KafkaOffsets

_names = itertools.count()


def _topic_with(bootstrap: str, records: int) -> str:
    topic = f"start-positions-{next(_names)}"
    create_topics(bootstrap, {topic: 1})
    produce_orders(bootstrap, topic, keys=records, updates=1, workload=Workload())
    return topic


def _resolve(bootstrap: str, group: str, tps: list[tuple[str, int]], starting: str) -> tuple[dict, dict]:
    committed: dict = {}
    positions = KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
        tps, starting, "fail", commit=lambda resolved: (committed.update(resolved), reset_offsets(
            bootstrap, group, dict(resolved))))
    return positions, committed


def test_a_new_group_starts_at_latest_and_commits_it(bootstrap):
    topic = _topic_with(bootstrap, 50)
    positions, committed = _resolve(bootstrap, f"new-group-{next(_names)}", [(topic, 0)], "latest")
    assert positions == committed == {(topic, 0): 50}


def test_a_topic_created_while_the_service_was_down_starts_at_earliest(bootstrap):
    group = f"started-group-{next(_names)}"
    known = _topic_with(bootstrap, 20)
    _resolve(bootstrap, group, [(known, 0)], "latest")  # the group's first start

    created_later = _topic_with(bootstrap, 30)  # while no process of the group ran
    positions, committed = _resolve(bootstrap, group, [(known, 0), (created_later, 0)], "latest")
    assert positions == {(known, 0): 20, (created_later, 0): 0}
    assert committed == {}  # nothing resolved to `latest`: a crash now still restarts at 0


def test_a_committed_offset_wins_over_the_starting_setting(bootstrap):
    group = f"committed-group-{next(_names)}"
    topic = _topic_with(bootstrap, 40)
    reset_offsets(bootstrap, group, {(topic, 0): 12})
    for starting in ("earliest", "latest"):
        positions, committed = _resolve(bootstrap, group, [(topic, 0)], starting)
        assert positions == {(topic, 0): 12}
        assert committed == {}
