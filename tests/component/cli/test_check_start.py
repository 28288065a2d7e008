"""`sink-service check` tells the start the service will make (issue #38), on a real broker.

Its group line used to look at the configured topics' commits only and promise SINK_STARTING_OFFSETS,
while the service decided on the whole group and, for a Delta target, never looked at the table.
Each test resolves the service's own start for the same group and checks the line says it.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from devkit.kafka_data import Workload, create_topics, produce_orders, reset_offsets
from sink_service.kafka_source.offsets import KafkaOffsets, Subscription
from tests.component.cli.test_check import check_in_process, line
from uploader.delta import DeltaTarget
from uploader.delta_settings import DeltaSettings

_names = itertools.count()


def _topic(bootstrap: str, partitions: int, records: int) -> str:
    topic = f"check-start-{next(_names)}-{time.monotonic_ns()}"
    create_topics(bootstrap, {topic: partitions})
    for partition in range(partitions):
        produce_orders(bootstrap, topic, keys=records, updates=1, workload=Workload(), partition=partition,
                       key_prefix=f"p{partition}")
    return topic


def _service_start(bootstrap: str, topic: str, partitions: int, group: str, starting: str,
                   table: DeltaTarget | None = None) -> dict:
    """Where the service would start every partition (nothing committed: the commit callbacks keep it)."""
    return KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
        [(topic, p) for p in range(partitions)], starting, "fail", commit=lambda _r: None,
        subscription=Subscription((topic,)), table_position=table.covered_to if table else None)


def _environ(bootstrap: str, topic: str, group: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_GROUP_ID": group,
            "SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "out"), **extra}


def test_partitions_without_a_commit_in_a_group_that_has_committed_start_at_earliest(bootstrap, tmp_path):
    topic = _topic(bootstrap, partitions=3, records=20)
    group = f"check-start-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 15})
    assert _service_start(bootstrap, topic, 3, group, "latest") == {(topic, 0): 15, (topic, 1): 0, (topic, 2): 0}
    code, out, _ = check_in_process(_environ(bootstrap, topic, group, tmp_path, SINK_STARTING_OFFSETS="latest"))
    said = line(out, f"OK consumer group {group}")
    assert code == 0, out
    assert "committed on 1 of 3 partition(s), lag 5" in said, said
    assert f"2 without a committed offset ({topic}:1, {topic}:2) start at their earliest offset, not at " \
           "SINK_STARTING_OFFSETS=latest" in said, said


def test_a_new_group_starts_every_partition_at_the_setting(bootstrap, tmp_path):
    topic = _topic(bootstrap, partitions=2, records=20)
    group = f"check-new-{next(_names)}"
    assert _service_start(bootstrap, topic, 2, group, "latest") == {(topic, 0): 20, (topic, 1): 20}
    code, out, _ = check_in_process(_environ(bootstrap, topic, group, tmp_path, SINK_STARTING_OFFSETS="latest"))
    said = line(out, f"OK consumer group {group}")
    assert code == 0 and "nothing committed yet: every partition starts at SINK_STARTING_OFFSETS=latest" in said


def test_a_delta_group_without_commits_resumes_at_the_tables_position(bootstrap, tmp_path):
    topic = _topic(bootstrap, partitions=2, records=20)
    group = f"check-delta-{next(_names)}"
    uri = str(tmp_path / "table")
    settings = DeltaSettings(table_uri=uri, group_id=group)
    write_deltalake(uri, pa.table({"id": pa.array([1], pa.int64())}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(settings.app_id(topic, 0), 12)]))
    starts = _service_start(bootstrap, topic, 2, group, "latest", DeltaTarget(settings))
    assert starts == {(topic, 0): 12, (topic, 1): 0}
    environ = _environ(bootstrap, topic, group, tmp_path, SINK_STARTING_OFFSETS="latest", SINK_TARGET="delta",
                       SINK_DELTA_TABLE_URI=uri, SINK_PRIMARY_KEYS="id")
    _code, out, _ = check_in_process(environ)
    said = line(out, f"OK consumer group {group}")
    assert "1 without a committed offset resume at the Delta table's position" in said, said
    assert f"1 without a committed offset ({topic}:1) start at their earliest offset" in said, said
    assert "nothing committed yet" not in said, said
