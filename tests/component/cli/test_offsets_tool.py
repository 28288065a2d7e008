"""`sink-service offsets` on a real broker: a Delta table's position, and a group that is still emptying.

A move back below what a Delta table holds for the group is refused (the service would skip every
replayed record, so the "moved" would be a replay that never happens); after a SIGTERM the stopped
instance stays a static member until its session times out, which the refusal explains and `--wait`
waits out.
"""

from __future__ import annotations

import io
import itertools
import threading
import time
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer
from deltalake import CommitProperties, Transaction, write_deltalake

from devkit.kafka_data import Workload, committed_offsets, create_topics, produce_orders, reset_offsets
from sink_service.cli import commands, offsets
from uploader.delta_settings import DeltaSettings

_names = itertools.count()


def _topic(bootstrap: str, records: int = 100) -> str:
    topic = f"offsets-tool-{next(_names)}-{time.monotonic_ns()}"
    create_topics(bootstrap, {topic: 1})
    produce_orders(bootstrap, topic, keys=records, updates=1, workload=Workload())
    return topic


def _offsets(environ: dict[str, str], *argv: str) -> tuple[int, str, str]:
    args = commands._parser().parse_args(["offsets", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = offsets.run(args, environ, out, err)
    return code, out.getvalue(), err.getvalue()


def _environ(bootstrap: str, topic: str, group: str, **extra: str) -> dict[str, str]:
    return {"SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SINK_TOPICS": topic, "SINK_GROUP_ID": group,
            "SINK_TARGET": "dir", "SINK_DIR_PATH": "/nonexistent/unused", **extra}


def _delta_environ(bootstrap: str, topic: str, group: str, tmp_path: Path, covered: int) -> dict[str, str]:
    """A Delta target whose table holds the partition's offsets below `covered` for the group."""
    uri = str(tmp_path / "table")
    settings = DeltaSettings(table_uri=uri, group_id=group)
    write_deltalake(uri, pa.table({"id": pa.array([1], pa.int64())}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(settings.app_id(topic, 0),
                                                                                     covered)]))
    return _environ(bootstrap, topic, group, SINK_TARGET="delta", SINK_DELTA_TABLE_URI=uri, SINK_PRIMARY_KEYS="id")


def test_a_move_below_a_delta_tables_position_is_refused_with_how_to_reapply(bootstrap, tmp_path):
    topic = _topic(bootstrap)
    group = f"delta-rewind-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 100})
    environ = _delta_environ(bootstrap, topic, group, tmp_path, covered=100)

    for argv in (["--to-earliest"], ["--to-offset", f"{topic}:0=40"], ["--to-earliest", "--dry-run"]):
        code, out, err = _offsets(environ, *argv)
        assert code == offsets.EXIT_USAGE, (argv, out, err)
        assert "moved" not in out, out
        assert "refused" in err and "SINK_TARGET=delta" in err and f"{topic}:0" in err and "100" in err, err
        assert "new SINK_GROUP_ID" in err and "python -m uploader push" in err and "Nothing was changed" in err
        assert committed_offsets(bootstrap, group, topic, 1) == {0: 100}

    code, out, err = _offsets(environ, "--to-offset", f"{topic}:0=100")  # not below the table: allowed
    assert code == offsets.EXIT_OK, err
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 100}


def test_a_delta_group_whose_table_is_behind_may_be_moved_back_to_it(bootstrap, tmp_path):
    topic = _topic(bootstrap)
    group = f"delta-behind-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 100})
    environ = _delta_environ(bootstrap, topic, group, tmp_path, covered=30)
    code, out, err = _offsets(environ, "--to-offset", f"{topic}:0=30")
    assert code == offsets.EXIT_OK, err
    assert "moved" in out
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 30}


def _member(bootstrap: str, group: str, topic: str, **extra: object) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "session.timeout.ms": 6000, **extra})
    assigned: list = []
    consumer.subscribe([topic], on_assign=lambda _c, parts: assigned.extend(parts))
    deadline = time.monotonic() + 30
    while not assigned and time.monotonic() < deadline:
        consumer.poll(0.1)
    assert assigned, "the member got no partition"
    return consumer


def test_wait_moves_once_the_last_member_has_left(bootstrap):
    topic = _topic(bootstrap, records=20)
    group = f"wait-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 20})
    member = _member(bootstrap, group, topic)
    leaves = threading.Timer(3.0, member.close)
    leaves.start()
    started = time.monotonic()
    try:
        code, _out, err = _offsets(_environ(bootstrap, topic, group), "--to-earliest", "--wait", "30")
    finally:
        leaves.join()
    assert code == offsets.EXIT_OK, err
    assert 2.5 < time.monotonic() - started < 30
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 0}


def test_a_stopped_static_member_is_explained_with_the_session_timeout(bootstrap):
    # What a SIGTERM leaves behind: the instance closed its consumer, but as a static member
    # (group.instance.id) it stays in the group until its session times out.
    topic = _topic(bootstrap, records=20)
    group = f"static-{next(_names)}"
    reset_offsets(bootstrap, group, {(topic, 0): 20})
    _member(bootstrap, group, topic, **{"group.instance.id": "stopped-instance"}).close()
    started = time.monotonic()
    code, _out, err = _offsets(_environ(bootstrap, topic, group, SINK_KAFKA_SESSION_TIMEOUT_MS="6000"),
                               "--to-earliest", "--wait", "2")
    assert code == offsets.EXIT_ACTIVE, err
    assert time.monotonic() - started >= 2, "it waited"
    assert "1 active member" in err and "static member" in err and "session.timeout.ms=6000" in err, err
    assert "--wait SECONDS" in err and "Nothing was changed" in err, err
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 20}
