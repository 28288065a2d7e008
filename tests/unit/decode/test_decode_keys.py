"""The Kafka key: `_key` per SINK_KEY_FORMAT, JSON key fields, the same-name rule, learned primary keys."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sink_service.decode.keys import (
    key_column,
    key_fields,
    learned_primary_keys,
    no_columns,
    unexpected_fields,
    with_key_fields,
)


def keys(*values: bytes | None) -> pa.Array:
    return pa.array(list(values), pa.binary())


@pytest.mark.parametrize("key_format, expected, type_", [
    ("string", ["k1", "\\xff", None], pa.string()),
    ("json", ["k1", "\\xff", None], pa.string()),
    ("raw", [b"k1", b"\xff", None], pa.binary()),
])
def test_key_column_per_format(key_format, expected, type_):
    column = key_column(keys(b"k1", b"\xff", None), key_format)
    assert column.type == type_
    assert column.to_pylist() == expected


def test_json_key_fields_are_prefixed_columns_row_for_row():
    fields = key_fields(keys(b'{"id": 1, "region": "eu"}', b'{"id": 2, "region": "us"}'), "key_")
    assert fields.failures == {}
    assert fields.table.to_pylist() == [{"key_id": 1, "key_region": "eu"}, {"key_id": 2, "key_region": "us"}]


def test_null_keys_give_null_fields_and_bad_keys_are_named():
    fields = key_fields(keys(None, b'{"id": 1}', b"not json", b'"scalar"', b"", None, b'{"id": 7}'), "")
    assert fields.table.column("id").to_pylist() == [None, 1, None, None, None, None, 7]
    assert sorted(fields.failures) == [2, 3, 4]
    assert all(kind == "invalid_key" and reason.startswith("key is not a JSON object")
               for reason, kind in fields.failures.values())


def test_keys_are_parsed_with_the_values_rules_big_integers_exact_and_timestamps_text():
    fields = key_fields(keys(b'{"id": 12345678901234567890, "at": "2024-01-02T10:00:00Z"}'), "")
    assert int(fields.table.column("id")[0].as_py()) == 12345678901234567890
    assert fields.table.column("at").to_pylist() == ["2024-01-02T10:00:00Z"]


def test_only_null_or_bad_keys_give_a_table_without_columns_of_the_right_length():
    fields = key_fields(keys(None, b"[1]"), "")
    assert (fields.table.num_rows, fields.table.num_columns) == (2, 0)
    assert list(fields.failures) == [1]


def test_key_and_value_fields_share_a_column_and_the_value_wins_where_it_has_one():
    key = pa.table({"id": [1, 2, 3], "region": ["eu", "eu", "us"]})
    value = pa.table({"id": ["a", None, "c"], "amount": [1.5, 2.5, 3.5]})
    merged = with_key_fields(key, value)
    assert merged.column_names == ["id", "region", "amount"]
    assert merged.column("id").to_pylist() == ["a", "2", "c"]  # joined to string, the key's where the value lacks it
    assert merged.column("region").to_pylist() == ["eu", "eu", "us"]


def test_without_key_fields_the_values_are_returned_as_they_are():
    value = pa.table({"a": [1]})
    assert with_key_fields(no_columns(1), value) is value


def test_primary_keys_are_learned_from_the_first_key_with_fields_sorted():
    fields = pa.table({"b": [None, 1, 2], "a": [None, 1, None], "c": [None, None, 3]})
    assert learned_primary_keys(fields) == ("a", "b")
    assert learned_primary_keys(pa.table({"a": pa.nulls(2)})) == ()


def test_a_key_with_other_fields_than_the_primary_keys_is_a_bad_record():
    fields = pa.table({"id": [1, 2, None], "extra": [None, "x", None], "nested": [None, None, {"a": 1}]})
    kept, failures = unexpected_fields(fields, ("id",))
    assert kept.column_names == ["id"]
    assert {row: kind for row, (_, kind) in failures.items()} == {1: "invalid_key", 2: "invalid_key"}
    assert "`extra`" in failures[1][0] and "id" in failures[1][0]


def test_a_primary_key_field_holding_an_object_is_a_bad_record():
    fields = pa.table({"id": [{"a": 1}, None]})
    _, failures = unexpected_fields(fields, ("id",))
    assert list(failures) == [0]
    assert "scalars" in failures[0][0]
