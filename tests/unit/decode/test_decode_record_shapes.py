"""`decode` with the record-shape settings: JSON keys, tombstones, metadata column selection."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from sink_service.decode import RAW_SCHEMA, DecodeSpec, decode

JSON_KEYS = DecodeSpec(None, (), "_offset", key_format="json", primary_keys_from_key=True)
SOFT_DELETE = DecodeSpec(None, (), "_offset", key_format="json", primary_keys_from_key=True, tombstones="soft-delete")


def raw(*records: tuple, start: int = 100) -> pa.RecordBatch:
    """Records as (key, value) or (key, value, headers)."""
    return pa.RecordBatch.from_pylist([
        {"topic": "t", "partition": 0, "offset": start + i, "timestamp_ms": 0, "key": r[0], "value": r[1],
         "headers": r[2] if len(r) > 2 else None}
        for i, r in enumerate(records)], schema=RAW_SCHEMA)


def rows(chunk) -> list[dict]:
    return [row for segment in chunk.segments for row in segment.to_pylist()]


def bad(chunk) -> dict[int, str]:
    return {b.offset: b.kind for b in chunk.bad_records}


# --- Keys --------------------------------------------------------------------------------------


def test_json_key_fields_become_prefixed_columns_and_the_primary_keys():
    spec = DecodeSpec(None, (), "_offset", key_format="json", key_fields_prefix="key_", primary_keys_from_key=True)
    chunk = decode(raw((b'{"region": "eu", "id": 1}', b'{"amount": 5}'), (b'{"id": 2, "region": "us"}', b'{}')), spec)
    assert chunk.bad_records == []
    assert chunk.primary_keys == ("key_id", "key_region")
    [segment] = chunk.segments
    assert segment.column_names[:3] == ["key_region", "key_id", "amount"]
    assert [(r["key_id"], r["key_region"], r["amount"], r["_key"]) for r in rows(chunk)] == [
        (1, "eu", 5, '{"region": "eu", "id": 1}'), (2, "us", None, '{"id": 2, "region": "us"}')]


def test_learned_primary_keys_hold_for_later_batches_and_other_keys_are_bad_records():
    first = decode(raw((b'{"id": 1}', b'{"a": 1}')), JSON_KEYS)
    later = DecodeSpec(None, first.primary_keys, "_offset", key_format="json", primary_keys_from_key=True)
    chunk = decode(raw((b'{"id": 2, "extra": 1}', b'{"a": 2}'), (b'{"other": 3}', b'{"a": 3}'),
                       (b'{"id": null}', b'{"a": 3}'), (b'{"id": 4}', b'{"a": 4}'), start=200), later)
    assert chunk.primary_keys == ("id",)
    assert bad(chunk) == {200: "invalid_key", 201: "invalid_key", 202: "missing_key"}
    assert [r["id"] for r in rows(chunk)] == [4]
    assert "extra" not in chunk.segments[0].column_names


def test_malformed_and_missing_json_keys_are_bad_records_under_the_error_policy():
    chunk = decode(raw((b"{oops", b'{"a": 1}'), (None, b'{"a": 2}'), (b'{"id": 3}', b'{"a": 3}')), JSON_KEYS)
    assert bad(chunk) == {100: "invalid_key", 101: "missing_key"}
    assert [(r["_offset"], r["id"]) for r in rows(chunk)] == [(102, 3)]


def test_a_batch_without_any_key_has_no_primary_keys_to_learn():
    chunk = decode(raw((None, b'{"a": 1}')), JSON_KEYS)
    assert bad(chunk) == {100: "missing_key"} and "no key" in chunk.bad_records[0].reason


def test_json_keys_with_explicit_primary_keys_are_columns_only():
    spec = DecodeSpec(None, ("id",), "_offset", key_format="json")
    chunk = decode(raw((b'{"k": 1, "extra": "x"}', b'{"id": 9}')), spec)
    assert chunk.bad_records == [] and chunk.primary_keys == ("id",)
    assert rows(chunk)[0]["extra"] == "x"


def test_same_name_in_key_and_value_the_value_wins_unless_it_lacks_the_field():
    chunk = decode(raw((b'{"id": 1}', b'{"id": 10, "a": 1}'), (b'{"id": 2}', b'{"a": 2}')), JSON_KEYS)
    assert [(r["id"], r["a"]) for r in rows(chunk)] == [(10, 1), (2, 2)]


def test_a_key_field_named_like_a_metadata_column_is_a_bad_record():
    chunk = decode(raw((b'{"_offset": 1}', b'{"a": 1}'), (b'{"id": 2}', b'{"a": 2}')),
                   DecodeSpec(None, ("id",), "_offset", key_format="json"))
    assert bad(chunk) == {100: "reserved_field"}


@pytest.mark.parametrize("key_format, expected", [("string", "\\xffk"), ("raw", b"\xffk")])
def test_string_and_raw_keys(key_format, expected):
    chunk = decode(raw((b"\xffk", b'{"a": 1}')), DecodeSpec(None, (), "_offset", key_format=key_format))
    assert rows(chunk)[0]["_key"] == expected


# --- Tombstones --------------------------------------------------------------------------------


def test_tombstones_are_skipped_by_default_counted_but_never_bad_records():
    chunk = decode(raw((b"k", b'{"id": 1}'), (b"k", None), (b"k", b'{"id": 3}')), DecodeSpec(None, ("id",), "_offset"))
    assert chunk.bad_records == []
    assert [(s.offset, s.kind) for s in chunk.skipped] == [(101, "tombstone")]
    assert [r["_offset"] for r in rows(chunk)] == [100, 102]


def test_tombstones_under_fail_are_bad_records():
    chunk = decode(raw((b"k", None)), DecodeSpec(None, ("id",), "_offset", tombstones="fail"))
    assert bad(chunk) == {100: "tombstone"} and chunk.skipped == []


def test_soft_delete_writes_a_deletion_row_in_offset_order():
    chunk = decode(raw((b'{"id": 1}', b'{"id": 1, "name": "a", "n": 1}'), (b'{"id": 2}', b'{"name": "b"}'),
                       (b'{"id": 1}', None), (b'{"id": 3}', b'{"name": "c"}')), SOFT_DELETE)
    assert chunk.bad_records == [] and chunk.skipped == []
    assert [(r["_offset"], r["id"], r["name"], r["n"], r["_deleted"]) for r in rows(chunk)] == [
        (100, 1, "a", 1, False), (101, 2, "b", None, False), (102, 1, None, None, True), (103, 3, "c", None, False)]


def test_soft_delete_of_only_tombstones_and_with_string_keys():
    chunk = decode(raw((b'{"id": 1}', None), (b'{"id": 2}', None)), SOFT_DELETE)
    assert [(r["id"], r["_deleted"]) for r in rows(chunk)] == [(1, True), (2, True)]
    spec = DecodeSpec(None, ("_key",), "_offset", tombstones="soft-delete")
    chunk = decode(raw((b"k1", b'{"a": 1}'), (b"k1", None)), spec)
    assert [(r["_key"], r["a"], r["_deleted"]) for r in rows(chunk)] == [("k1", 1, False), ("k1", None, True)]


def test_soft_delete_reserves_deleted_and_a_tombstone_without_key_is_a_bad_record():
    chunk = decode(raw((b'{"id": 1}', b'{"_deleted": true}'), (None, None), (b'{"id": 3}', b'{"a": 3}')), SOFT_DELETE)
    assert bad(chunk) == {100: "reserved_field", 101: "missing_key"}
    assert [r["_offset"] for r in rows(chunk)] == [102]


# --- Metadata columns --------------------------------------------------------------------------


def test_selected_metadata_columns_with_headers():
    spec = DecodeSpec(None, ("id",), "_offset", metadata_columns=("_partition", "_headers"))
    chunk = decode(raw((b"k", b'{"id": 1}', [("trace", b"t-1")]), (b"k", b'{"id": 2}')), spec)
    [segment] = chunk.segments
    assert segment.column_names == ["id", "_partition", "_offset", "_headers"]
    assert segment.column("_headers").to_pylist() == ['{"trace":"t-1"}', None]


def test_a_value_field_named_headers_is_reserved_even_when_not_written():
    chunk = decode(raw((b"k", b'{"id": 1, "_headers": "x"}')), DecodeSpec(None, ("id",), "_offset"))
    assert bad(chunk) == {100: "reserved_field"}


# --- Obfuscation and flattening, in the decode flow ----------------------------------------------


def test_flattened_rows_name_learned_primary_keys_by_their_columns():
    spec = DecodeSpec(None, (), "_offset", key_format="json", primary_keys_from_key=True, flatten=True,
                      lowercase_fields=True)
    chunk = decode(raw((b'{"Tenant-Id": "a", "n": 1}', b'{"customer": {"name": "Ann"}, "tags": [1]}'),
                       (b'{"Tenant-Id": "b", "n": 2}', b'{"customer": {"name": "Bo"}}')), spec)
    assert chunk.bad_records == [] and chunk.primary_keys == ("n", "tenant_id")
    assert [(r["tenant_id"], r["n"], r["customer_name"], r["tags"]) for r in rows(chunk)] == [
        ("a", 1, "Ann", "[1]"), ("b", 2, "Bo", None)]
    later = DecodeSpec(**{**spec.__dict__, "primary_keys": chunk.primary_keys})
    again = decode(raw((b'{"Tenant-Id": "c", "n": 3}', b'{}'), (b'{"n": 4, "x": 1}', b'{}'), start=200), later)
    assert [r["tenant_id"] for r in rows(again)] == ["c"] and bad(again) == {201: "invalid_key"}


def test_fields_that_flatten_to_one_column_in_one_record_are_a_bad_record():
    spec = DecodeSpec(None, ("id",), "_offset", flatten=True, tombstones="soft-delete")
    chunk = decode(raw((b"k", b'{"id": 1, "a": {"b": 1}, "a_b": 2}'), (b"k", b'{"id": 2, "a_b": 3}'),
                       (b"k", None)), DecodeSpec(**{**spec.__dict__, "primary_keys": ("_key",)}))
    assert bad(chunk) == {100: "field_collision"}
    assert [(r["_offset"], r.get("a_b"), r["_deleted"]) for r in rows(chunk)] == [(101, 3, False), (102, None, True)]


def test_obfuscation_applies_to_nested_paths_and_the_key_before_flattening():
    spec = DecodeSpec(None, ("id",), "_offset", flatten=True, obfuscate_fields=("customer.email", "_key"),
                      obfuscation_method="sha1", obfuscation_salt=b"pepper")
    [row] = rows(decode(raw((b"k1", b'{"id": 1, "customer": {"email": "a@b.c", "name": "Ann"}}')), spec))
    assert row["customer_name"] == "Ann"
    assert row["customer_email"] == hashlib.sha1(b"pepper" + b"a@b.c").hexdigest()
    assert row["_key"] == hashlib.sha1(b"pepperk1").hexdigest()
