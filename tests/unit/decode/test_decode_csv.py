"""CSV and raw values through `sink_service.decode`: the chunk-wise fast path, bisection to the
values at fault, headers, quoting."""

from __future__ import annotations

import decimal

import pyarrow as pa

from sink_service.decode import RAW_SCHEMA, DecodeSpec, decode
from sink_service.decode.csv_values import CsvFormat
from sink_service.shared.ddl import parse_ddl

COLUMNS = parse_ddl("id INT, name STRING, amount DECIMAL(10,2)")


def raw_batch(values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([
        {"topic": "t", "partition": 2, "offset": 50 + i, "timestamp_ms": 0, "key": b"k", "value": value}
        for i, value in enumerate(values)], schema=RAW_SCHEMA)


def csv_spec(fmt: CsvFormat) -> DecodeSpec:
    return DecodeSpec(None, (), "_offset", value_format="csv", csv=fmt, metadata_columns=())


def test_quoted_fields_hold_delimiters_doubled_quotes_and_newlines():
    chunk = decode(raw_batch([b'1,Ann,1.50', b'2,"B, b",2', b'3,"multi\nline",3', b'4,"say ""hi""",',
                              b'5,,0']), csv_spec(CsvFormat(COLUMNS)))
    [table] = chunk.segments
    assert table.schema.field("amount").type == pa.decimal128(10, 2)
    assert table.select(["id", "name", "amount"]).to_pylist() == [
        {"id": 1, "name": "Ann", "amount": decimal.Decimal("1.50")},
        {"id": 2, "name": "B, b", "amount": decimal.Decimal("2.00")},
        {"id": 3, "name": "multi\nline", "amount": decimal.Decimal("3.00")},
        {"id": 4, "name": 'say "hi"', "amount": None},  # an empty field is null, but in a STRING column ""
        {"id": 5, "name": "", "amount": decimal.Decimal("0.00")},
    ]
    assert not chunk.bad_records


def test_wrong_column_counts_unconvertible_fields_and_open_quotes_are_bad_records():
    values = [b"1,a,1", b"2,b", b"3,c,3,extra", b"x,d,4", b'5,"open,5', b"", b"6,f,6", b"7,g,7\n8,h,8"]
    chunk = decode(raw_batch(values), csv_spec(CsvFormat(COLUMNS)))
    assert [row["id"] for row in chunk.segments[0].to_pylist()] == [1, 6]
    bad = {b.offset: (b.kind, b.reason) for b in chunk.bad_records}
    assert {offset: kind for offset, (kind, _) in bad.items()} == {
        51: "invalid_csv", 52: "invalid_csv", 53: "invalid_csv", 54: "invalid_csv", 55: "empty_value",
        57: "invalid_csv"}
    assert bad[51][1] == "invalid CSV: Expected 3 columns, got 2: 2,b"
    assert bad[53][1] == "invalid CSV: column 0: CSV conversion error to int32: invalid value 'x'"
    assert bad[57][1] == "invalid CSV: value holds 2 CSV rows, not one"


def test_a_header_per_value_names_its_columns_and_the_declared_ones_are_typed():
    fmt = CsvFormat(parse_ddl("id BIGINT"), header=True, delimiter=";", quote="'")
    chunk = decode(raw_batch([b"id;name\n1;'a;b'", b"name;id;extra\nb;2;x", b"id;name"]), csv_spec(fmt))
    [table] = chunk.segments
    assert table.schema.field("id").type == pa.int64() and table.schema.field("extra").type == pa.string()
    assert table.select(["id", "name", "extra"]).to_pylist() == [
        {"id": 1, "name": "a;b", "extra": None}, {"id": 2, "name": "b", "extra": "x"}]
    assert [(b.offset, b.kind) for b in chunk.bad_records] == [(52, "invalid_csv")]


def test_raw_values_are_one_binary_column_as_they_came():
    values = [b"\x00\xffbinary", b"", b"text"]
    chunk = decode(raw_batch(values), DecodeSpec(None, ("_key",), "_offset", value_format="raw"))
    [table] = chunk.segments
    assert table.schema.field("value").type == pa.binary()
    assert table.column("value").to_pylist() == values
    assert table.column("_offset").to_pylist() == [50, 51, 52]
