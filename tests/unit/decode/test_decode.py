"""Decoding raw Kafka record batches into typed rows with metadata columns."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from sink_service.decode import RAW_SCHEMA, BadRecord, DecodeSpec, decode
from sink_service.shared.column_names import DEFAULT_METADATA_COLUMNS
from sink_service.shared.ddl import parse_ddl

TOPIC, PARTITION = "orders", 3
INFER = DecodeSpec(None, (), "_offset")
INFER_PK = DecodeSpec(None, ("id",), "_offset")
TOMBSTONES_FAIL = DecodeSpec(None, ("id",), "_offset", tombstones="fail")


def raw_batch(values, *, start=100, keys=None, topic=TOPIC, partition=PARTITION) -> pa.RecordBatch:
    rows = [
        {
            "topic": topic, "partition": partition, "offset": start + i,
            "timestamp_ms": 1_700_000_000_000 + i,
            "key": None if keys is None else keys[i], "value": value,
        }
        for i, value in enumerate(values)
    ]
    return pa.RecordBatch.from_pylist(rows, schema=RAW_SCHEMA)


def rows(chunk) -> list[dict]:
    return [row for segment in chunk.segments for row in segment.to_pylist()]


def offsets(chunk) -> list[int]:
    return [row["_offset"] for row in rows(chunk)]


def bad_offsets(chunk) -> list[int]:
    return [b.offset for b in chunk.bad_records]


def test_metadata_columns():
    chunk = decode(raw_batch([b'{"id": 1}', b'{"id": 2}'], keys=[b"k1", None]), INFER)
    assert chunk.bad_records == []
    [segment] = chunk.segments
    assert segment.column_names == ["id", *DEFAULT_METADATA_COLUMNS]
    assert DEFAULT_METADATA_COLUMNS == ("_key", "_topic", "_partition", "_offset", "_timestamp")
    first, second = segment.to_pylist()
    assert first["_key"] == "k1" and second["_key"] is None
    assert first["_topic"] == TOPIC and first["_partition"] == PARTITION
    assert [first["_offset"], second["_offset"]] == [100, 101]
    assert segment.schema.field("_timestamp").type == pa.timestamp("ms", tz="UTC")
    assert first["_timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
    assert segment.schema.field("_offset").type == pa.int64()


def test_inferred_schema_keeps_every_field():
    values = [b'{"id": 1, "a": "x"}', b'{"id": 2, "b": 2.5}', b'{"id": 3, "c": {"d": [1, 2]}}']
    chunk = decode(raw_batch(values), INFER)
    assert chunk.bad_records == []
    result = rows(chunk)
    assert [r["id"] for r in result] == [1, 2, 3]
    assert [r["a"] for r in result] == ["x", None, None]
    assert [r["b"] for r in result] == [None, 2.5, None]
    assert [r["c"] for r in result] == [None, None, {"d": [1, 2]}]


def test_field_that_appears_only_late_in_a_large_chunk_is_kept():
    values = [b'{"id": %d}' % i for i in range(5000)] + [b'{"id": 5000, "late": "here"}']
    chunk = decode(raw_batch(values, start=0), INFER)
    result = rows(chunk)
    assert len(result) == 5001
    assert result[-1]["late"] == "here"
    assert result[0]["late"] is None


def test_incompatible_types_join_in_one_segment_in_offset_order():
    values = [b'{"id": 1}', b'{"id": "one"}', b'{"id": 3}']
    chunk = decode(raw_batch(values), INFER)
    assert chunk.bad_records == []
    assert len(chunk.segments) == 1
    assert offsets(chunk) == [100, 101, 102]
    assert [r["id"] for r in rows(chunk)] == ["1", "one", "3"]


def test_int_and_float_values_share_one_column():
    chunk = decode(raw_batch([b'{"x": 1}', b'{"x": 2.5}']), INFER)
    [segment] = chunk.segments
    assert segment.column("x").to_pylist() == [1.0, 2.5]


def test_declared_schema_selects_and_casts():
    schema = parse_ddl("id STRING, amount DOUBLE, qty BIGINT, price DECIMAL(10,2), ok BOOLEAN, "
                       "at TIMESTAMP, tags ARRAY<STRING>, s STRUCT<a: INT, b: STRING>")
    value = (b'{"id": "a", "amount": 3, "qty": 9007199254740993, "price": "12.34", "ok": true,'
             b' "at": "2024-01-02T03:04:05Z", "tags": ["x", "y"], "s": {"a": 1, "b": "z"}, "undeclared": 1}')
    chunk = decode(raw_batch([value, b'{"id": "b"}']), DecodeSpec(schema, ("id",), "_offset"))
    assert chunk.bad_records == []
    [segment] = chunk.segments
    assert segment.column_names == [*schema.names, *DEFAULT_METADATA_COLUMNS]
    for name in schema.names:
        assert segment.schema.field(name).type == schema.field(name).type
    first, second = segment.to_pylist()
    assert first["amount"] == 3.0
    assert first["qty"] == 9007199254740993
    assert first["price"] == decimal.Decimal("12.34")
    assert first["ok"] is True
    assert first["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert first["tags"] == ["x", "y"]
    assert first["s"] == {"a": 1, "b": "z"}
    assert second["amount"] is None and second["tags"] is None


def test_declared_decimal_from_a_json_number():
    chunk = decode(raw_batch([b'{"p": 12.34}']), DecodeSpec(parse_ddl("p DECIMAL(10,2)"), (), "_offset"))
    assert rows(chunk)[0]["p"] == decimal.Decimal("12.34")


def test_declared_date_from_an_iso_date_string():
    chunk = decode(raw_batch([b'{"d": "2024-01-02"}']), DecodeSpec(parse_ddl("d DATE"), (), "_offset"))
    assert chunk.bad_records == []
    assert rows(chunk)[0]["d"] == dt.date(2024, 1, 2)


def test_declared_string_field_accepts_a_json_number():
    # Spark's JSON reader turns any JSON value into its text for a STRING field; numeric ids
    # declared as STRING are common.
    chunk = decode(raw_batch([b'{"id": 42}']), DecodeSpec(parse_ddl("id STRING"), ("id",), "_offset"))
    assert chunk.bad_records == []
    assert rows(chunk)[0]["id"] == "42"


def test_declared_string_field_holds_the_json_text_of_any_value():
    values = [b'{"id": "a", "v": {"k": [1, 2], "t": true}}', b'{"id": "b", "v": [1, 2]}', b'{"id": "c", "v": false}']
    chunk = decode(raw_batch(values), DecodeSpec(parse_ddl("id STRING, v STRING"), ("id",), "_offset"))
    assert chunk.bad_records == []
    assert [r["v"] for r in rows(chunk)] == ['{"k":[1,2],"t":true}', "[1,2]", "false"]


def test_declared_type_mismatch_is_a_bad_record_not_a_failure_of_the_chunk():
    schema = parse_ddl("id STRING, qty INT")
    values = [b'{"id": "a", "qty": 1}', b'{"id": "b", "qty": "many"}', b'{"id": "c", "qty": 3}']
    chunk = decode(raw_batch(values), DecodeSpec(schema, ("id",), "_offset"))
    assert offsets(chunk) == [100, 102]
    assert bad_offsets(chunk) == [101]


@pytest.mark.parametrize("value, reason_word", [
    (b'{"id": 1', "JSON"),
    (b"not json", "JSON"),
    (b"[1, 2, 3]", "JSON"),
    (b"42", "JSON"),
    (b"", "empty"),
    (b"   ", "empty"),
    (None, "tombstone"),
    (b'{"other": 1}', "primary key"),
    (b'{"id": null}', "primary key"),
    (b'{"id": 1, "_offset": 7}', "_offset"),
])
def test_bad_record_is_reported_with_position_and_good_records_are_kept(value, reason_word):
    values = [b'{"id": 10}', b'{"id": 11}', value, b'{"id": 13}', b'{"id": 14}']
    chunk = decode(raw_batch(values, start=500), TOMBSTONES_FAIL)
    assert len(chunk.bad_records) == 1, chunk.bad_records
    [bad] = chunk.bad_records
    assert isinstance(bad, BadRecord)
    assert (bad.topic, bad.partition, bad.offset) == (TOPIC, PARTITION, 502)
    assert reason_word.lower() in bad.reason.lower()
    assert f"topic={TOPIC} partition={PARTITION} offset=502" in bad.describe()
    assert offsets(chunk) == [500, 501, 503, 504]
    assert [r["id"] for r in rows(chunk)] == [10, 11, 13, 14]


def test_missing_primary_key_in_every_record():
    chunk = decode(raw_batch([b'{"a": 1}', b'{"a": 2}']), INFER_PK)
    assert chunk.segments == []
    assert bad_offsets(chunk) == [100, 101]
    assert all("`id`" in b.reason and "missing" in b.reason for b in chunk.bad_records)


def test_missing_order_field_is_a_bad_record():
    spec = DecodeSpec(None, ("id",), "version")
    chunk = decode(raw_batch([b'{"id": 1, "version": 1}', b'{"id": 2}']), spec)
    assert offsets(chunk) == [100]
    assert bad_offsets(chunk) == [101]
    assert "order field" in chunk.bad_records[0].reason


def test_kafka_key_as_primary_key():
    spec = DecodeSpec(None, ("_key",), "_offset")
    chunk = decode(raw_batch([b'{"a": 1}', b'{"a": 2}'], keys=[b"k", None]), spec)
    assert offsets(chunk) == [100]
    assert bad_offsets(chunk) == [101]


def test_many_bad_records_all_reported_in_offset_order_and_good_ones_kept():
    values = []
    expected_bad = []
    for i in range(200):
        if i % 7 == 3:
            values.append(b"{broken")
            expected_bad.append(i)
        elif i % 11 == 5:
            values.append(None)
            expected_bad.append(i)
        else:
            values.append(b'{"id": %d}' % i)
    chunk = decode(raw_batch(values, start=0), TOMBSTONES_FAIL)
    assert bad_offsets(chunk) == expected_bad
    good = [i for i in range(200) if i not in expected_bad]
    assert offsets(chunk) == good
    assert [r["id"] for r in rows(chunk)] == good


def test_two_json_objects_in_one_value_is_a_bad_record():
    chunk = decode(raw_batch([b'{"id": 1}{"id": 2}', b'{"id": 3}']), INFER_PK)
    assert bad_offsets(chunk) == [100]
    assert offsets(chunk) == [101]


def test_concatenated_objects_beside_an_empty_value_do_not_shift_rows():
    # One value holds two objects, the next value is empty: the row count still matches the
    # record count, but each row must belong to the record it came from.
    chunk = decode(raw_batch([b'{"id": 1}{"id": 2}', b"", b'{"id": 3}']), INFER_PK)
    assert bad_offsets(chunk) == [100, 101]
    assert [(r["_offset"], r["id"]) for r in rows(chunk)] == [(102, 3)]


@pytest.mark.parametrize("value", [
    b'{"id":\n 1,\n "name": "x"\n}',
    b'{\r\n  "id": 1,\r\n  "name": "x"\r\n}\r\n',
    b'\n{"id": 1, "name": "x"}\n',
])
def test_newlines_between_tokens_still_parse(value):
    chunk = decode(raw_batch([b'{"id": 0, "name": "w"}', value, b'{"id": 2, "name": "y"}']), INFER_PK)
    assert chunk.bad_records == []
    got = [(r["_offset"], r["id"], r["name"]) for r in rows(chunk)]
    assert got == [(100, 0, "w"), (101, 1, "x"), (102, 2, "y")]


def test_empty_batch_decodes_to_nothing():
    chunk = decode(raw_batch([]), INFER_PK)
    assert chunk.segments == [] and chunk.bad_records == []


def test_non_utf8_keys_are_kept_escaped():
    keys = [b"plain", b"\xff\xfeab", "caf\u00e9".encode()]
    chunk = decode(raw_batch([b'{"id": 1}', b'{"id": 2}', b'{"id": 3}'], keys=keys), INFER_PK)
    assert chunk.bad_records == []
    assert [r["_key"] for r in rows(chunk)] == ["plain", "\\xff\\xfeab", "caf\u00e9"]


def test_only_tombstones():
    chunk = decode(raw_batch([None, None]), TOMBSTONES_FAIL)
    assert chunk.segments == []
    assert bad_offsets(chunk) == [100, 101]
    assert all("tombstone" in b.reason for b in chunk.bad_records)


def test_unicode_and_escapes_in_values():
    chunk = decode(raw_batch([b'{"id": 1, "s": "line\\nbreak \\u00e9 \xe2\x82\xac"}']), INFER_PK)
    assert rows(chunk)[0]["s"] == "line\nbreak \u00e9 \u20ac"


def test_values_sliced_from_a_larger_batch_decode_correctly():
    batch = raw_batch([b'{"id": %d}' % i for i in range(10)], start=0)
    chunk = decode(batch.slice(4, 3), INFER_PK)
    assert offsets(chunk) == [4, 5, 6]
    assert [r["id"] for r in rows(chunk)] == [4, 5, 6]


# --- Inference never changes data (issue 9) -------------------------------------------------


def test_empty_objects_carry_no_column_and_empty_arrays_stay_lists():
    values = [b'{"id": 1, "meta": {}, "tags": [], "deep": {"inner": {}}, "objs": [{}]}',
              b'{"id": 2, "meta": {}, "tags": [], "deep": {"inner": {}, "n": 5}, "objs": []}']
    chunk = decode(raw_batch(values), INFER_PK)
    assert chunk.bad_records == []
    [segment] = chunk.segments
    assert "meta" not in segment.column_names  # a field-less object carries no value
    assert segment.schema.field("deep").type == pa.struct([("n", pa.int64())])
    assert [r["tags"] for r in rows(chunk)] == [[], []]
    assert [r["objs"] for r in rows(chunk)] == [[None], []]  # the element count is kept
    assert [r["deep"] for r in rows(chunk)] == [{"n": None}, {"n": 5}]


def test_integers_beyond_int64_arrive_exactly_as_decimals():
    big = [12345678901234567890, 12345678901234567891, -98765432109876543210]
    values = [b'{"id": %d, "n": {"v": [%d]}}' % (b, b) for b in big] + [b'{"id": 1, "n": {"v": [2]}}']
    chunk = decode(raw_batch(values), INFER_PK)
    assert chunk.bad_records == []
    [segment] = chunk.segments
    assert segment.schema.field("id").type == pa.decimal128(38, 0)
    assert [int(r["id"]) for r in rows(chunk)] == [*big, 1]
    assert [[int(v) for v in r["n"]["v"]] for r in rows(chunk)] == [[b] for b in big] + [[2]]


@pytest.mark.parametrize("values, expected", [
    # beyond 38 digits: no decimal holds it
    ([b'{"id": 1, "x": 123456789012345678901234567890123456789012}', b'{"id": 2, "x": 7}'],
     ["123456789012345678901234567890123456789012", "7"]),
    # beyond int64 next to a fraction in the same field: neither a decimal(38,0) nor a double holds both
    ([b'{"id": 1, "x": 12345678901234567890}', b'{"id": 2, "x": 1.25}'], ["12345678901234567890", "1.25"]),
])
def test_integers_no_decimal_holds_arrive_as_their_text(values, expected):
    chunk = decode(raw_batch(values), INFER_PK)
    assert chunk.bad_records == []
    assert [r["x"] for r in rows(chunk)] == expected
    assert [r["id"] for r in rows(chunk)] == [1, 2]


def test_large_doubles_stay_doubles():
    chunk = decode(raw_batch([b'{"x": 1e19}', b'{"x": 2.5e30}', b'{"x": "12345678901234567890"}']), INFER)
    assert [r["x"] for r in rows(chunk)] == ["1e+19", "2.5e+30", "12345678901234567890"]
    chunk = decode(raw_batch([b'{"x": 1e19}', b'{"x": 1.5}']), INFER)
    assert chunk.segments[0].schema.field("x").type == pa.float64()


def test_timestamp_like_strings_stay_strings():
    values = [b'{"id": 1, "at": "2024-01-02T10:00:00+02:00", "d": "2024-01-02", "s": {"t": "2024-01-02T10:00:00Z"}}',
              b'{"id": 2, "at": "2024-01-02T10:00:00.5+02:00", "d": "2024-01-03", "s": {"t": "2024-01-03T10:00:00Z"}}']
    for chunk_values in (values[:1], values):
        chunk = decode(raw_batch(chunk_values), INFER_PK)
        [segment] = chunk.segments
        assert segment.schema.field("at").type == pa.string()
        assert segment.schema.field("s").type == pa.struct([("t", pa.string())])
        got = [(r["at"], r["d"], r["s"]["t"]) for r in rows(chunk)]
        assert got == [
            ("2024-01-02T10:00:00+02:00", "2024-01-02", "2024-01-02T10:00:00Z"),
            ("2024-01-02T10:00:00.5+02:00", "2024-01-03", "2024-01-03T10:00:00Z"),
        ][:len(chunk_values)]


def test_declared_timestamp_still_parses_and_declared_string_keeps_the_text():
    schema = parse_ddl("id STRING, at TIMESTAMP, text STRING, day DATE")
    value = b'{"id": "a", "at": "2024-01-02 10:00:00", "text": "2024-01-02T10:00:00+02:00", "day": "2024-01-02"}'
    chunk = decode(raw_batch([value]), DecodeSpec(schema, ("id",), "_offset"))
    assert chunk.bad_records == []
    [row] = rows(chunk)
    assert row["at"] == dt.datetime(2024, 1, 2, 10, 0, tzinfo=dt.UTC)
    assert row["text"] == "2024-01-02T10:00:00+02:00"
    assert row["day"] == dt.date(2024, 1, 2)


def test_declared_string_field_keeps_a_big_integer_exactly():
    chunk = decode(raw_batch([b'{"id": 12345678901234567890}']), DecodeSpec(parse_ddl("id STRING"), ("id",), "_offset"))
    assert rows(chunk)[0]["id"] == "12345678901234567890"


@pytest.mark.parametrize("value", [
    b'{"id": 1, "s": "line\nbreak"}',  # a raw newline inside a string is not JSON
    b'{"id": 1, "s": "line\r\nbreak"}',
    b'{"id": 1, "s": "caf\xe9"}',  # Latin-1, not UTF-8
    b'{"id": 1, "s\xff": 2}',
    b'{"id": 1, "s": "\xed\xa0\x80"}',  # an encoded surrogate is not UTF-8 either
])
def test_invalid_json_is_a_bad_record_and_never_repaired(value):
    chunk = decode(raw_batch([b'{"id": 0, "s": "a"}', value, b'{"id": 2, "s": "b"}']), INFER_PK)
    assert bad_offsets(chunk) == [101]
    assert chunk.bad_records[0].kind == "invalid_json"
    assert [(r["_offset"], r["s"]) for r in rows(chunk)] == [(100, "a"), (102, "b")]


def test_a_field_that_flips_type_gives_one_segment_in_the_widest_type():
    values = [b'{"id": %d, "x": %s}' % (i, b"%d" % i if i % 2 else b'"s%d"' % i) for i in range(400)]
    chunk = decode(raw_batch(values, start=0), INFER_PK)
    assert chunk.bad_records == []
    assert len(chunk.segments) == 1
    assert [r["x"] for r in rows(chunk)] == [str(i) if i % 2 else f"s{i}" for i in range(400)]
    assert offsets(chunk) == list(range(400))


@pytest.mark.timeout(5)
def test_a_field_that_flips_in_every_record_of_a_large_chunk_is_typed_without_splitting_it():
    # Bisection would split this chunk into 20,000 single records (seconds of parse calls).
    values = [b'{"id": %d, "x": %s}' % (i, b"%d" % i if i % 2 else b'"s%d"' % i) for i in range(20_000)]
    chunk = decode(raw_batch(values, start=0), INFER_PK)
    assert chunk.bad_records == [] and len(chunk.segments) == 1
    assert chunk.segments[0].column("x").to_pylist()[:4] == ["s0", "1", "s2", "3"]


def test_objects_and_scalars_in_one_field_become_json_text():
    values = [b'{"x": {"a": 1, "b": [true, null]}}', b'{"x": 5}', b'{"x": [1, 2]}', b'{"x": null}', b'{"x": false}']
    chunk = decode(raw_batch(values), INFER)
    assert chunk.bad_records == []
    assert [r["x"] for r in rows(chunk)] == ['{"a":1,"b":[true,null]}', "5", "[1,2]", None, "false"]


@pytest.mark.parametrize("value, field, expected", [
    (b'{"x": [1, {"c": "d"}, "e", 1.50, null]}', "x", ["1", '{"c":"d"}', "e", "1.50", None]),
    (b'{"items": [{"q": 1}, {"q": "two"}, {"r": true}]}', "items",
     [{"q": "1", "r": None}, {"q": "two", "r": None}, {"q": None, "r": True}]),
    (b'{"x": [[1], 2, [true]]}', "x", ["[1]", "2", "[true]"]),
])
def test_arrays_that_mix_kinds_keep_every_element_as_text(value, field, expected):
    chunk = decode(raw_batch([b'{"id": 1}', value]), INFER)
    assert chunk.bad_records == []
    assert [r.get(field) for r in rows(chunk)] == [None, expected]


def test_a_mixed_array_with_a_duplicate_key_is_still_a_bad_record():
    chunk = decode(raw_batch([b'{"x": [1, "a"], "y": 1, "y": 2}']), INFER)
    assert bad_offsets(chunk) == [100]


def test_a_value_holding_only_empty_objects_is_a_row_with_its_metadata():
    chunk = decode(raw_batch([b'{"meta": {}}', b'{"meta": {"inner": {}}}']), INFER)
    assert chunk.bad_records == []
    assert [r["_offset"] for r in rows(chunk)] == [100, 101]
