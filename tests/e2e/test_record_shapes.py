"""Record shapes against a real broker and local_ems: JSON keys as primary keys, soft deletes,
and the metadata columns chosen by SINK_METADATA_COLUMNS (with `_headers`)."""

from __future__ import annotations

import hashlib
import json

import pytest
from confluent_kafka import Producer

from devkit.kafka_data import create_topics
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed

pytestmark = pytest.mark.e2e

COMMIT_BOUND_S = 40


def _produce(bootstrap: str, topic: str, records: list[tuple]) -> None:
    """Records as (key, value) or (key, value, headers), into partition 0 in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for key, value, *headers in records:
        producer.produce(topic, key=key, value=value, partition=0, headers=headers[0] if headers else None)
    producer.flush(30)


def _key(tenant: str, n: int) -> bytes:
    return json.dumps({"tenant": tenant, "id": n}).encode()


def test_json_keys_are_the_primary_keys_and_soft_deletes_leave_the_latest_row_deleted(
        bootstrap, ems, unique, service_env, services):
    topic, group = unique("keyed"), unique("group")
    create_topics(bootstrap, {topic: 1})
    records = [(_key("a", n), json.dumps({"name": f"v{version}-{n}", "version": version}).encode())
               for version in range(3) for n in range(20)]
    records += [(_key("a", n), None) for n in range(0, 20, 4)]  # deletes: 0, 4, 8, 12, 16
    records += [(_key("a", 8), b'{"name": "back", "version": 9}')]  # 8 comes back after its delete
    _produce(bootstrap, topic, records)
    env = service_env(topic, group, SINK_PRIMARY_KEYS="", SINK_KEY_FORMAT="json", SINK_KEY_FIELDS_PREFIX="key_",
                      SINK_TOMBSTONES="soft-delete", SINK_FLUSH_RECORDS=25)
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), COMMIT_BOUND_S, "all offsets committed")
    assert service.terminate() == 0

    rows = {(row["key_tenant"], row["key_id"]): row for row in ems.table(topic)}
    assert sorted(rows) == [("a", n) for n in range(20)]
    deleted = {n for (_, n), row in rows.items() if row["_deleted"]}
    assert deleted == {0, 4, 12, 16}, "the latest row of a deleted key says deleted, and only then"
    assert all(rows[("a", n)]["name"] is None for n in deleted)
    assert rows[("a", 8)]["name"] == "back" and rows[("a", 1)]["name"] == "v2-1"
    uploads = ems.uploads(topic)
    assert len(uploads) >= 2
    assert {upload["params"]["primaryKeys"] for upload in uploads} == {"key_id,key_tenant"}


def test_metadata_columns_are_those_chosen_plus_the_order_column(bootstrap, ems, unique, service_env, services):
    topic, group = unique("meta"), unique("group")
    create_topics(bootstrap, {topic: 1})
    _produce(bootstrap, topic, [
        (b"k1", b'{"id": "1", "v": 1}', [("trace", b"t-1"), ("retry", b"2")]),
        (b"k2", b'{"id": "2", "v": 2}'),
        (b"k3", b'{"id": "3", "v": 3}', [("bin", b"\xff"), ("none", None)]),
    ])
    env = service_env(topic, group, SINK_METADATA_COLUMNS="_partition,_headers", SINK_ORDER_FIELD="_timestamp")
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), COMMIT_BOUND_S, "all offsets committed")
    assert service.terminate() == 0

    rows = sorted(ems.table(topic), key=lambda row: row["id"])
    assert set(rows[0]) == {"id", "v", "_partition", "_timestamp", "_headers"}  # no _key, _topic, _offset
    assert [json.loads(row["_headers"]) if row["_headers"] else None for row in rows] == [
        {"trace": "t-1", "retry": "2"}, None, {"bin": "\\xff", "none": None}]
    assert all(row["_partition"] == 0 and row["_timestamp"] for row in rows)


def test_compaction_uploads_fewer_rows_for_the_same_end_state(bootstrap, ems, unique, service_env, services):
    """200 keys x 10 versions: with SINK_COMPACT_FILES each file keeps a key's latest row only."""
    records = [(f"k{n}".encode(), json.dumps({"id": f"k{n}", "version": version}).encode())
               for version in range(10) for n in range(200)]
    tables = {}
    for compact in ("true", "false"):
        topic, group = unique(f"compact-{compact}"), unique("group")
        create_topics(bootstrap, {topic: 1})
        _produce(bootstrap, topic, records)
        service = services(service_env(topic, group, SINK_COMPACT_FILES=compact, SINK_FLUSH_RECORDS=500))
        wait_until(lambda t=topic, g=group: all_committed(bootstrap, g, t, 1), COMMIT_BOUND_S,
                   "all offsets committed", process=service)
        assert service.terminate() == 0
        uploads = ems.uploads(topic)
        tables[compact] = ({row["id"]: row["version"] for row in ems.table(topic)},
                           sum(upload["rows"] for upload in uploads), len(uploads))
    (compacted, rows_on, files_on), (plain, rows_off, files_off) = tables["true"], tables["false"]
    assert compacted == plain == {f"k{n}": 9 for n in range(200)}
    assert files_on == files_off == 4
    assert rows_off == 2000 and rows_on == 4 * 200, (rows_on, rows_off)


def test_ems_rows_are_flat_and_obfuscated_fields_hashed(bootstrap, ems, unique, service_env, services):
    topic, group = unique("flat"), unique("group")
    create_topics(bootstrap, {topic: 1})
    value = {"id": 7, "customer": {"name": "Ann", "e-mail": "ann@example.com"}, "items": [{"sku": "A1"}]}
    _produce(bootstrap, topic, [(b"7", json.dumps(value).encode())])
    env = service_env(topic, group, SINK_OBFUSCATE_FIELDS="customer.e-mail", SINK_OBFUSCATION_METHOD="sha512",
                      SINK_OBFUSCATION_SALT="pepper", SINK_FLUSH_INTERVAL_MS=500)
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), COMMIT_BOUND_S, "committed", process=service)
    assert service.terminate() == 0
    assert "pepper" not in service.output()
    [row] = ems.table(topic)
    assert (row["id"], row["customer_name"], row["items"]) == (7, "Ann", '[{"sku":"A1"}]')
    assert row["customer_e_mail"] == hashlib.sha512(b"pepper" + b"ann@example.com").hexdigest()
    assert not any(isinstance(v, str) and "ann@example.com" in v for v in row.values())
