"""Starting from a point in time, and `sink-service offsets`, on a real broker (noida-db).

Records carry explicit timestamps one second apart from `_BASE`, so a time names an exact offset:
`_BASE + 3.5 s` falls between offsets 3 and 4. What matters to an operator who says "re-send
everything since 14:00": the first record at or after that time, a time after the last record
meaning "nothing yet" (the log end), and a head that retention removed being said out loud.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from devkit.kafka_data import committed_offsets, create_topics, reset_offsets
from sink_service.cli import commands, offsets
from sink_service.kafka_source.offsets import KafkaOffsets
from sink_service.shared.instants import iso_ms

_BASE = 1_795_528_800_000  # 2026-11-24T14:00:00Z
_names = itertools.count()


def _topic(bootstrap: str, partitions: int = 1, records: int = 10) -> str:
    """A topic whose partitions each hold `records` records at _BASE, _BASE + 1 s, ..."""
    topic = f"point-in-time-{next(_names)}-{time.monotonic_ns()}"
    create_topics(bootstrap, {topic: partitions})
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(partitions):
        for i in range(records):
            producer.produce(topic, key=f"k{i}".encode(), value=json.dumps({"id": i}).encode(),
                             partition=partition, timestamp=_BASE + i * 1000)
    assert producer.flush(30) == 0
    return topic


def _delete_head(bootstrap: str, topic: str, partition: int, before: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result(30)


def _resolve(bootstrap: str, group: str, tps: list[tuple[str, int]], starting: str) -> tuple[dict, dict]:
    committed: dict = {}
    positions = KafkaOffsets({"bootstrap.servers": bootstrap}, group).resolve_start(
        tps, starting, "fail", commit=lambda resolved: (committed.update(resolved),
                                                        reset_offsets(bootstrap, group, dict(resolved))))
    return positions, committed


# --- SINK_STARTING_OFFSETS=timestamp:... ----------------------------------------------------------


def test_a_new_group_starts_at_the_first_record_at_or_after_the_time_and_commits_it(bootstrap, caplog):
    topic = _topic(bootstrap, partitions=2)
    group = f"from-time-{next(_names)}"
    with caplog.at_level(logging.INFO, logger="sink_service.kafka_source.offsets"):
        positions, committed = _resolve(bootstrap, group, [(topic, 0), (topic, 1)],
                                        "timestamp:2026-11-24T15:00:03.500+01:00")  # _BASE + 3.5 s
    assert positions == committed == {(topic, 0): 4, (topic, 1): 4}
    assert committed_offsets(bootstrap, group, topic, 2) == {0: 4, 1: 4}  # a restart keeps it
    # Both partitions start alike: one line names them and each one's offset.
    line = next(r.getMessage() for r in caplog.records if f"topic={topic} partitions=0-1 (2)" in r.getMessage())
    assert "2026-11-24T14:00:03.500Z" in line and "offsets (partition:offset) 0-1:4" in line, line


def test_a_time_after_the_last_record_starts_at_the_log_end(bootstrap, caplog):
    topic = _topic(bootstrap)
    with caplog.at_level(logging.INFO, logger="sink_service.kafka_source.offsets"):
        positions, committed = _resolve(bootstrap, f"after-end-{next(_names)}", [(topic, 0)],
                                        "timestamp:2026-11-25T00:00:00Z")
    assert positions == committed == {(topic, 0): 10}
    assert any("no record at or after 2026-11-25T00:00:00.000Z: starting at the log end, offset 10"
               in r.getMessage() for r in caplog.records)


def test_a_log_that_starts_after_the_time_starts_at_its_earliest_offset_and_says_so(bootstrap, caplog):
    topic = _topic(bootstrap)
    _delete_head(bootstrap, topic, 0, 6)  # records of _BASE .. _BASE + 5 s are gone
    with caplog.at_level(logging.INFO, logger="sink_service.kafka_source.offsets"):
        positions, committed = _resolve(bootstrap, f"deleted-head-{next(_names)}", [(topic, 0)],
                                        "timestamp:2026-11-24T14:00:02Z")
    assert positions == committed == {(topic, 0): 6}
    line = next(r.getMessage() for r in caplog.records if f"topic={topic} partition=0" in r.getMessage())
    assert "the log starts after 2026-11-24T14:00:02.000Z (offsets below 6 were deleted)" in line, line
    assert "earliest offset 6" in line


def test_a_committed_offset_wins_over_a_starting_time(bootstrap):
    topic = _topic(bootstrap)
    group = f"committed-time-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 8})
    positions, committed = _resolve(bootstrap, group, [(topic, 0)], "timestamp:2026-11-24T14:00:00Z")
    assert positions == {(topic, 0): 8}
    assert committed == {}


# --- sink-service offsets -------------------------------------------------------------------------


def _environ(bootstrap: str, topic: str, group: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_GROUP_ID": group,
            "SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "out"), **extra}


def _offsets(environ: dict[str, str], *argv: str) -> tuple[int, str, str]:
    args = commands._parser().parse_args(["offsets", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = offsets.run(args, environ, out, err)
    return code, out.getvalue(), err.getvalue()


def test_show_gives_committed_log_bounds_and_lag_as_a_table_and_as_json(bootstrap, tmp_path):
    topic = _topic(bootstrap, partitions=2)
    group = f"show-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 7})
    environ = _environ(bootstrap, topic, group, tmp_path)

    code, out, err = _offsets(environ)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"group {group}"
    assert lines[1].split() == ["TOPIC", "PARTITION", "COMMITTED", "LOG-START", "LOG-END", "LAG"]
    assert lines[2].split() == [topic, "0", "7", "0", "10", "3"]
    assert lines[3].split() == [topic, "1", "-", "0", "10", "-"]
    assert lines[4] == "total lag 3; 1 partition(s) without a committed offset"

    code, out, err = _offsets(environ, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["group"] == group and document["action"] == "show"
    assert document["partitions"] == [
        {"topic": topic, "partition": 0, "committed": 7, "log_start": 0, "log_end": 10, "lag": 3},
        {"topic": topic, "partition": 1, "committed": None, "log_start": 0, "log_end": 10, "lag": None},
    ]


def test_to_timestamp_moves_every_partition_and_prints_before_and_after(bootstrap, tmp_path):
    topic = _topic(bootstrap, partitions=2)
    _delete_head(bootstrap, topic, 1, 6)
    group = f"move-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 9, (topic, 1): 10})
    environ = _environ(bootstrap, topic, group, tmp_path)

    code, out, err = _offsets(environ, "--to-timestamp", "2026-11-24T14:00:03.500Z")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"group {group}: moved to {iso_ms(_BASE + 3500)}"
    assert lines[1].split()[:7] == ["TOPIC", "PARTITION", "BEFORE", "AFTER", "LOG-START", "LOG-END", "LAG-AFTER"]
    assert lines[2].split()[:7] == [topic, "0", "9", "4", "0", "10", "6"]
    assert lines[3].split()[:7] == [topic, "1", "10", "6", "6", "10", "4"]
    assert "the log starts after" in lines[3]
    assert committed_offsets(bootstrap, group, topic, 2) == {0: 4, 1: 6}  # what Kafka holds now


def test_dry_run_prints_the_plan_and_commits_nothing(bootstrap, tmp_path):
    topic = _topic(bootstrap)
    group = f"dry-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 9})
    environ = _environ(bootstrap, topic, group, tmp_path)

    code, out, err = _offsets(environ, "--to-earliest", "--dry-run", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert (document["action"], document["to"], document["dry_run"]) == ("move", "earliest", True)
    assert [(p["before"], p["after"]) for p in document["partitions"]] == [(9, 0)]
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 9}


def test_explicit_offsets_latest_and_a_topic_restriction(bootstrap, tmp_path):
    first, second = _topic(bootstrap, partitions=2), _topic(bootstrap)
    group = f"explicit-{next(_names)}"
    environ = _environ(bootstrap, f"{first},{second}", group, tmp_path)

    code, out, err = _offsets(environ, "--to-offset", f"{first}:1=3", "--to-offset", f"{first}:0=5")
    assert code == 0, err
    assert committed_offsets(bootstrap, group, first, 2) == {0: 5, 1: 3}
    assert committed_offsets(bootstrap, group, second, 1) == {}  # not named: not moved
    shown = {tuple(line.split()[:4]) for line in out.splitlines()}
    assert (second, "0", "-", "-") in shown  # ... yet shown, before and after
    assert (first, "1", "-", "3") in shown

    code, out, err = _offsets(environ, "--to-latest", "--topic", second)
    assert code == 0, err
    assert committed_offsets(bootstrap, group, second, 1) == {0: 10}
    assert committed_offsets(bootstrap, group, first, 2) == {0: 5, 1: 3}
    assert first not in out


def test_a_move_is_refused_while_the_group_has_an_active_member(bootstrap, tmp_path):
    topic = _topic(bootstrap)
    group = f"active-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 9})
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000,
                       "enable.auto.commit": False})
    member.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        assert member.assignment()
        # Through the console script, as an operator runs it.
        done = subprocess.run([sys.executable, "-m", "sink_service", "offsets", "--to-earliest"],
                              env=_environ(bootstrap, topic, group, tmp_path, PATH="/usr/bin:/bin"),
                              capture_output=True, text=True, timeout=120)
    finally:
        member.close()
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert f"refused: the group {group} has 1 active member(s)" in line
    assert "Nothing was changed" in line
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 9}


@pytest.mark.parametrize(("argv", "message"), [
    (["--to-timestamp", "2026-11-24T14:00:00"], "--to-timestamp: '2026-11-24T14:00:00' has no UTC offset"),
    (["--to-timestamp", "tuesday"], "--to-timestamp: 'tuesday' is not an ISO-8601 time"),
    (["--to-offset", "orders-0=5"], "expected TOPIC:PARTITION=OFFSET"),
    (["--to-offset", "{topic}:0=99"], "outside the log [0, 10]"),
    (["--to-offset", "{topic}:7=1"], "is not a partition of the configured topic(s)"),
    (["--topic", "other"], "--topic other: not a configured topic"),
    (["--dry-run"], "--dry-run plans a move"),
])
def test_usage_errors_exit_2_and_change_nothing(bootstrap, tmp_path, argv, message):
    topic = _topic(bootstrap)
    group = f"usage-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 9})
    code, _, err = _offsets(_environ(bootstrap, topic, group, tmp_path), *[a.format(topic=topic) for a in argv])
    assert code == 2
    assert message in err, err
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 9}


def test_a_missing_topic_and_a_bad_configuration_exit_2(bootstrap, tmp_path):
    code, _, err = _offsets(_environ(bootstrap, "no-such-topic-here", "g", tmp_path))
    assert code == 2
    assert "SINK_TOPICS names topic(s) the broker does not have: no-such-topic-here" in err

    code, _, err = _offsets(_environ(bootstrap, "orders", "g", tmp_path, SINK_STARTING_OFFSETS="timestamp:soon",
                                     SINK_FLUSH_RECORDS="lots"))
    assert code == 2
    assert "2 configuration problem(s)" in err
    assert "SINK_STARTING_OFFSETS" in err and "SINK_FLUSH_RECORDS" in err
