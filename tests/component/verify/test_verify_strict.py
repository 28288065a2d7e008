"""`sink-service verify` is strict (issue #37, item 13): targets built by the real task code from a
real broker's records, then made wrong in ways `verify` used to call EQUAL: a lost column, a row
ahead of every record, a row applied past the commits with other content, an order column stored as
text, a deletion row keeping its old values, a nested field lost."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from devkit.kafka_data import create_topics, reset_offsets
from sink_service.config import load_config
from sink_service.verify.report import Report
from sink_service.verify.run import VerifyOptions, verify
from tests.component.verify.sinking import (
    LAST_FILE,
    MIDDLE_FILE,
    SUNK,
    TOPIC,
    Target,
    build,
    environment,
    run_verify,
    sink_range,
    task_spec,
)

FIRST_FILE = f"{0:020d}-{9:020d}.parquet"
FILES = (FIRST_FILE, MIDDLE_FILE, LAST_FILE)
LIVE_KEYS = 14 * len(SUNK)  # the keys whose latest record is not a deletion


def counts(report: Report) -> dict[str, int]:
    [table] = report.tables
    return {status: n for status, n in table.counts.items() if n}


def rewrite(target: Target, partition: int, name: str, change) -> None:
    target.put(partition, name, change(target.file(partition, name)))


def set_where(table: pa.Table, key: str, column: str, new: object) -> pa.Table:
    """`table` with `column` set to `new` in the row of `key`."""
    index = table.schema.get_field_index(column)
    values = pc.if_else(pc.equal(table["_key"], key), pa.scalar(new, table.schema.field(index).type), table[column])
    return table.set_column(index, column, values)


@pytest.mark.parametrize("kind", ["dir", "ems", "delta"])
def test_a_column_the_target_lost_fails_every_key_holding_a_value_there(kind, bootstrap, topic, tmp_path, request):
    """Was EQUAL, with the note "the target has no column status; not compared"."""
    target = build(kind, bootstrap, tmp_path, request)
    if kind == "dir":
        for partition in SUNK:
            for name in FILES:
                rewrite(target, partition, name, lambda t: t.drop_columns(["status"]))
    elif kind == "ems":
        target.sql(f'ALTER TABLE "{TOPIC}" DROP COLUMN status')
    else:
        from deltalake import write_deltalake

        rows = target.delta().to_pyarrow_table().drop_columns(["status"])
        write_deltalake(target.env["SINK_DELTA_TABLE_URI"], rows, mode="overwrite", schema_mode="overwrite")
    report = run_verify(target, examples=1)
    assert not report.equal
    assert counts(report) == {"equal": 2, "differing": LIVE_KEYS}  # the deletions of k0-3, k1-3 hold no status
    [table] = report.tables
    [example] = table.examples["differing"]
    assert (example["key"], example["offset"]) == ({"_key": "k0-0"}, 10)
    assert example["differences"] == {"status": {"expected": "PAID", "target_lacks_column": True}}
    assert f"the target has no column status: {LIVE_KEYS} of the topic's latest rows hold a value there" in table.notes
    assert report.to_text().endswith(f"result: NOT EQUAL: {LIVE_KEYS} differing")


@pytest.mark.parametrize("kind", ["dir", "ems", "delta"])
def test_a_row_ahead_of_every_record_in_the_topic_is_a_failure(kind, bootstrap, topic, tmp_path, request):
    """k1-5 at order 30: partition 1 ends at offset 28, so no record has it. Was `ahead` and EQUAL."""
    target = build(kind, bootstrap, tmp_path, request)
    if kind == "dir":
        rewrite(target, 1, MIDDLE_FILE, lambda t: set_where(t, "k1-5", "_offset", 30))
    elif kind == "ems":
        target.sql(f'UPDATE "{TOPIC}" SET _offset = 30 WHERE _key = ?', "k1-5")
    else:
        target.delta().update(updates={"_offset": "30"}, predicate="_key = 'k1-5'")
    report = run_verify(target)
    assert not report.equal
    assert counts(report) == {"equal": 2 * 15 - 1, "invented": 1}
    [example] = report.tables[0].examples["invented"]
    assert (example["key"], example["expected_order"], example["target_order"]) == ({"_key": "k1-5"}, "15", "30")
    assert "result: NOT EQUAL: 1 invented" in report.to_text()


@pytest.mark.parametrize("kind", ["ems", "delta"])
def test_rows_applied_past_the_commits_are_compared_with_those_records(kind, bootstrap, topic, tmp_path, request):
    """A target that applies files holds partition 0's offsets 26-27 when the service stopped between
    its upload and its commit: k0-0 version 2 and the new key k0-99. Was: k0-99 `extra` (NOT EQUAL),
    and k0-0 `ahead` whatever it held."""
    target = build(kind, bootstrap, tmp_path, request)
    sink_range(target.config, task_spec(target.config), 0, 26, 28)
    report = run_verify(target)
    assert report.equal, report.to_text()
    assert counts(report) == {"equal": 2 * 15 - 1, "ahead": 2}
    assert [p.beyond_records for p in report.partitions] == [2, 2, 3]  # partition 2: never committed
    if kind == "ems":
        target.sql(f'UPDATE "{TOPIC}" SET amount = 0 WHERE _key = ?', "k0-0")
    else:
        target.delta().update(updates={"amount": "0"}, predicate="_key = 'k0-0'")
    report = run_verify(target)
    assert counts(report) == {"equal": 2 * 15 - 1, "ahead": 1, "differing": 1}
    [example] = report.tables[0].examples["differing"]
    assert (example["key"], example["offset"], example["past_commit"]) == ({"_key": "k0-0"}, 26, True)
    assert example["differences"] == {"amount": {"expected": 25.0, "target": 0.0}}
    assert "offset 26 (past the committed offset)" in report.to_text()


def test_an_order_column_stored_as_text_compares_as_numbers(bootstrap, topic, tmp_path, request):
    """As text "9" > "19": every key updated across files read as stale, and a row at "100" hid behind
    the right one at "11"."""
    target = build("dir", bootstrap, tmp_path, request)
    for partition in SUNK:
        for name in FILES:
            rewrite(target, partition, name, lambda t: t.set_column(
                t.schema.get_field_index("_offset"), "_offset", pc.cast(t["_offset"], pa.string())))
    report = run_verify(target)
    assert report.equal, report.to_text()
    middle = target.file(0, MIDDLE_FILE)
    bogus = set_where(middle.filter(pc.equal(middle["_key"], "k0-1")), "k0-1", "_offset", "100")
    target.put(0, MIDDLE_FILE, pa.concat_tables([middle, bogus]))
    report = run_verify(target)
    assert counts(report) == {"equal": 2 * 15 - 1, "invented": 1}
    assert report.tables[0].examples["invented"][0]["key"] == {"_key": "k0-1"}


@pytest.mark.parametrize("kind", ["dir", "delta"])
def test_a_deletion_row_keeping_old_values_is_a_difference(kind, bootstrap, topic, tmp_path, request):
    """k0-3's latest record is a tombstone: its row must hold `_deleted` and null value fields."""
    target = build(kind, bootstrap, tmp_path, request)
    if kind == "dir":
        rewrite(target, 0, LAST_FILE, lambda t: set_where(t, "k0-3", "status", "PAID"))
    else:
        target.delta().update(updates={"status": "'PAID'"}, predicate="_key = 'k0-3'")
    report = run_verify(target)
    assert counts(report) == {"equal": 2 * 15 - 1, "differing": 1}
    [example] = report.tables[0].examples["differing"]
    assert (example["key"], example["offset"]) == ({"_key": "k0-3"}, 20)
    assert example["differences"] == {"status": {"expected": None, "target": "PAID"}}


def test_a_nested_field_the_target_lost_is_a_difference(bootstrap, tmp_path):
    """Records with `customer: {name, email}` kept as a struct (dir); files rewritten without `email`."""
    name = f"verify-customers-{uuid.uuid4().hex[:6]}"
    create_topics(bootstrap, {name: 1})
    producer = Producer({"bootstrap.servers": bootstrap})
    for n, email in enumerate(["a@x", None, "c@x"]):
        producer.produce(name, key=f"c{n}".encode(), value=json.dumps(
            {"id": n, "customer": {"name": f"C{n}", "email": email}}).encode(), partition=0)
    producer.flush(30)
    env = {**environment(bootstrap, f"verify-nested-{uuid.uuid4().hex[:6]}", tmp_path / "scratch",
                         SINK_TARGET="dir", SINK_DIR_PATH=str(tmp_path / "out")), "SINK_TOPICS": name}
    config = load_config(env)
    sink_range(config, task_spec(config), 0, 0, 3, topic=name)
    reset_offsets(bootstrap, config.group_id, {(name, 0): 3})
    [path] = (tmp_path / "out" / name / "0").glob("*.parquet")
    rows = pq.read_table(path)
    assert rows.schema.field("customer").type.get_field_index("email") >= 0  # kept nested, as the topic has it
    customer = rows["customer"].combine_chunks()
    without_email = pa.StructArray.from_arrays([customer.field("name")], names=["name"], mask=customer.is_null())
    pq.write_table(rows.set_column(rows.schema.get_field_index("customer"), "customer", without_email), path)
    report = verify(config, VerifyOptions(temp_dir=tmp_path))
    assert counts(report) == {"equal": 1, "differing": 2}
    first = report.tables[0].examples["differing"][0]
    assert first["key"] == {"_key": "c0"}
    assert first["differences"] == {"customer": {"expected": {"name": "C0", "email": "a@x"},
                                                 "target": {"name": "C0", "email": None}}}

