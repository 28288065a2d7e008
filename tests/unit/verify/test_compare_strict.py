"""The comparison is strict (issue #37, item 13): each way a wrong target used to read as EQUAL, on
hand-made Parquet files. Each test here failed on the comparison before it: a column the target lacks
was a note, an `ahead` row was never compared, a text order column ordered as text, and a value that
does not cast to the topic's type compared as null."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.verify.compare import Comparer
from sink_service.verify.expected import PARTITION_COLUMN, TOPIC_COLUMN
from sink_service.verify.report import Report
from sink_service.verify.target import TargetFile
from tests.unit.verify.test_compare import expected_file, row, target_file


@pytest.fixture
def comparer(tmp_path: Path):
    c = Comparer(tmp_path / "db", memory_limit="256MB")
    yield c
    c.close()


def test_a_column_the_target_lacks_fails_the_keys_holding_a_value_there(tmp_path, comparer):
    """Was: "the target has no column email; not compared" and EQUAL."""
    expected = expected_file(tmp_path / "e.parquet", [
        row("a", 1, 1.0, email="a@x"), row("b", 2, 1.0, email=None), row("c", 3, 2.0, email="c@x")])
    target = [target_file(tmp_path / "t.parquet", [row("a", 1, 1.0), row("b", 2, 1.0), row("c", 3, 2.0)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=1)
    assert not result.equal
    assert (result.counts["equal"], result.counts["differing"]) == (1, 2)  # b's email is null: nothing lost
    assert result.examples["differing"] == [{
        "key": {"id": "a"}, "expected_order": "1", "target_order": "1", "topic": "t", "partition": 0, "offset": 1,
        "target_file": "t.parquet", "target_offset": 1,
        "differences": {"email": {"expected": "a@x", "target_lacks_column": True}}}]
    assert result.notes == ["the target has no column email: 2 of the topic's latest rows hold a value there"]
    text = Report("g", "dir /out", "_offset", ("id",), tables=[result]).to_text()
    assert 'email "a@x" in the topic, no such column in the target' in text
    assert text.endswith("result: NOT EQUAL: 2 differing")


def test_an_ahead_row_no_record_has_is_a_failure(tmp_path, comparer):
    """Was: `ahead`, never a failure, whatever the row held."""
    expected = expected_file(tmp_path / "e.parquet", [row("a", 1, 1.0)])
    target = [target_file(tmp_path / "t.parquet", [row("a", 7, 5.0)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5)
    assert result.counts["invented"] == 1 and not result.equal
    assert result.examples["invented"][0]["target_order"] == "7"


def test_ahead_rows_compare_with_the_records_past_the_committed_offsets(tmp_path, comparer):
    """The service uploads before it commits: a row past the commits is fine if a record past them has it."""
    expected = expected_file(tmp_path / "e.parquet", [
        row("same", 1, 1.0), row("wrong", 2, 1.0), row("invented", 3, 1.0), row("tie", 4, 1.0)])
    beyond = expected_file(tmp_path / "b.parquet", [
        row("same", 10, 2.0), row("wrong", 11, 2.0), row("new", 12, 1.0), row("bad-new", 13, 1.0),
        row("same", 14, 3.0)])
    target = [target_file(tmp_path / "t.parquet", [
        row("same", 10, 2.0), row("wrong", 11, 9.0), row("invented", 30, 1.0), row("new", 12, 1.0),
        row("bad-new", 13, 4.0), row("tie", 4, 1.0)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5, beyond=[beyond])
    assert {s: n for s, n in result.counts.items() if n} == {"equal": 1, "ahead": 2, "differing": 2, "invented": 1}
    assert not result.equal
    wrong, bad_new = result.examples["differing"]
    assert (wrong["key"], wrong["offset"], wrong["past_commit"], wrong["differences"]) == (
        {"id": "wrong"}, 11, True, {"amount": {"expected": 2.0, "target": 9.0}})
    assert (bad_new["key"], bad_new["offset"], bad_new["differences"]) == (
        {"id": "bad-new"}, 13, {"amount": {"expected": 1.0, "target": 4.0}})
    assert result.examples["invented"][0]["key"] == {"id": "invented"}
    text = Report("g", "dir /out", "_offset", ("id",), tables=[result]).to_text()
    assert "offset 11 (past the committed offset)" in text


def test_only_ahead_rows_matching_records_past_the_commits_are_equal(tmp_path, comparer):
    expected = expected_file(tmp_path / "e.parquet", [row("a", 1, 1.0)])
    beyond = expected_file(tmp_path / "b.parquet", [row("a", 2, 1.0)])
    target = [target_file(tmp_path / "t.parquet", [row("a", 2, 1.0)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5, beyond=[beyond])
    assert result.counts["ahead"] == 1 and result.equal


def test_records_past_the_commits_with_new_columns_and_types_compare(tmp_path, comparer):
    """The records past the commits may carry a field the earlier ones lack, or a wider type."""
    expected = expected_file(tmp_path / "e.parquet", [row("a", 1, 1.0, n=1)])
    beyond = expected_file(tmp_path / "b.parquet", [row("a", 2, 1.0, n=2.5, note="x"), row("b", 3, 1.0, n=1.0)])
    target = [target_file(tmp_path / "t.parquet", [row("a", 2, 1.0, n=2.5, note="x"), row("b", 3, 1.0, n=1.0)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5, beyond=[beyond])
    assert result.counts["ahead"] == 2 and result.equal, result.examples


def test_nothing_committed_yet_but_rows_applied_past_the_start(tmp_path, comparer):
    """A Delta table merged its first range, then the service stopped before committing it."""
    beyond = expected_file(tmp_path / "b.parquet", [row("a", 0, 1.0), row("b", 1, 1.0)])
    target = [target_file(tmp_path / "t.parquet", [row("a", 0, 1.0), row("b", 1, 5.0), row("c", 2, 1.0)])]
    result = comparer.compare("t", [], target, ("id",), "_offset", examples=5, beyond=[beyond])
    assert {s: n for s, n in result.counts.items() if n} == {"ahead": 1, "differing": 1, "extra": 1}


def _text_order_target(path: Path, rows: list[tuple[str, str, float]]) -> TargetFile:
    pq.write_table(pa.table({"id": [r[0] for r in rows], "amount": [r[2] for r in rows],
                             "_offset": [r[1] for r in rows]}), path)
    return TargetFile(path, "t", 0, 0, where=path.name)


def test_a_text_order_column_orders_and_compares_as_the_topics_numbers(tmp_path, comparer):
    """As text "9" > "10": the bogus row at 10 hid behind the right one at 9, and b read as stale."""
    expected = expected_file(tmp_path / "e.parquet", [row("a", 9, 1.0), row("b", 19, 1.0)])
    target = [_text_order_target(tmp_path / "t.parquet", [
        ("a", "9", 1.0), ("a", "10", 5.0), ("b", "9", 0.0), ("b", "19", 1.0)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5)
    assert {s: n for s, n in result.counts.items() if n} == {"equal": 1, "invented": 1}, result.examples
    assert result.examples["invented"][0]["key"] == {"id": "a"}


def test_a_value_that_does_not_cast_to_the_topics_type_is_a_difference(tmp_path, comparer):
    """An order value "x9", or text where the topic has null: was an order of NULL or an equal null."""
    expected = expected_file(tmp_path / "e.parquet", [row("a", 5, 1.0), row("b", 6, None)])
    pq.write_table(pa.table({"id": ["a", "b"], "amount": ["1.0", "lots"], "_offset": ["x9", "6"]}),
                   tmp_path / "t.parquet")
    target = [TargetFile(tmp_path / "t.parquet", "t", 0, 0, where="t.parquet")]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5)
    assert result.counts["differing"] == 2 and not result.equal
    a, b = result.examples["differing"]
    assert a["differences"] == {"_offset": {"expected": 5, "target": "x9", "target_does_not_cast_to": "BIGINT"}}
    assert b["differences"] == {"amount": {"expected": None, "target": "lots", "target_does_not_cast_to": "DOUBLE"}}


def test_a_struct_field_the_target_lacks_is_a_difference(tmp_path, comparer):
    customer = pa.struct([("name", pa.string()), ("email", pa.string())])
    e = pa.table({"id": ["a", "b"], "customer": pa.array([{"name": "A", "email": "a@x"},
                                                          {"name": "B", "email": None}], customer),
                  "_offset": pa.array([1, 2], pa.int64()), TOPIC_COLUMN: ["t", "t"],
                  PARTITION_COLUMN: pa.array([0, 0], pa.int32())})
    pq.write_table(e, tmp_path / "e.parquet")
    old = pa.struct([("name", pa.string())])
    pq.write_table(pa.table({"id": ["a", "b"], "customer": pa.array([{"name": "A"}, {"name": "B"}], old),
                             "_offset": pa.array([1, 2], pa.int64())}), tmp_path / "t.parquet")
    result = comparer.compare("t", [tmp_path / "e.parquet"], [TargetFile(tmp_path / "t.parquet", where="t")],
                              ("id",), "_offset", examples=5)
    assert (result.counts["differing"], result.counts["equal"]) == (1, 1), result.examples
    assert result.examples["differing"][0]["differences"] == {
        "customer": {"expected": {"name": "A", "email": "a@x"}, "target": {"name": "A", "email": None}}}


def test_a_deletion_row_keeping_its_old_values_is_a_difference(tmp_path, comparer):
    """A soft delete's value fields are null: a target row `_deleted` but holding the old values is wrong."""
    expected = expected_file(tmp_path / "e.parquet", [
        row("gone", 4, None, _deleted=True), row("right", 5, None, _deleted=True)])
    target = [target_file(tmp_path / "t.parquet", [
        row("gone", 4, 3.0, _deleted=True), row("right", 5, None, _deleted=True)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5)
    assert (result.counts["differing"], result.counts["equal"]) == (1, 1)
    assert result.examples["differing"][0]["differences"] == {"amount": {"expected": None, "target": 3.0}}


def test_a_key_deleted_past_the_commits_may_be_gone_from_the_target(tmp_path, comparer):
    """A Delta table with SINK_DELTA_HARD_DELETES applied a tombstone past the commits: the key is gone.
    Was `missing`. Gone while the latest record past the commits is not a deletion stays `missing`."""
    expected = expected_file(tmp_path / "e.parquet", [
        row("deleted", 1, 1.0, _deleted=False), row("revived", 2, 1.0, _deleted=False),
        row("lost", 3, 1.0, _deleted=False)])
    beyond = expected_file(tmp_path / "b.parquet", [
        row("deleted", 5, None, _deleted=True), row("revived", 6, None, _deleted=True),
        row("revived", 7, 2.0, _deleted=False)])
    target = [target_file(tmp_path / "t.parquet", [row("other", 0, 1.0, _deleted=False)])]
    result = comparer.compare("t", [expected], target, ("id",), "_offset", examples=5, beyond=[beyond])
    assert {s: n for s, n in result.counts.items() if n} == {"ahead": 1, "missing": 2, "extra": 1}
    [ahead] = result.examples["ahead"]
    assert (ahead["key"], ahead["offset"], ahead["past_commit"]) == ({"id": "deleted"}, 5, True)
    assert [e["key"]["id"] for e in result.examples["missing"]] == ["revived", "lost"]
