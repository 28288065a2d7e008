"""Metadata columns: which are written (SINK_METADATA_COLUMNS), and reserved names."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sink_service.decode import DecodeSpec
from sink_service.decode.metadata import split_reserved, with_metadata, written_metadata
from sink_service.decode.raw import RAW_SCHEMA
from sink_service.shared.column_names import METADATA_COLUMNS


def raw(n: int = 2) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"topic": "t", "partition": 1, "offset": 5 + i, "timestamp_ms": 1000 * i, "key": b"k",
          "value": b"{}", "headers": [("h", b"v")] if i else None} for i in range(n)], schema=RAW_SCHEMA)


@pytest.mark.parametrize("selected, order_field, primary_keys, expected", [
    (("_key", "_topic", "_partition", "_offset", "_timestamp"), "_offset", (), ("_key", "_topic", "_partition",
                                                                              "_offset", "_timestamp")),
    (("_headers", "_key"), "_offset", (), ("_key", "_offset", "_headers")),  # the order column always
    ((), "_timestamp", ("_key",), ("_key", "_timestamp")),  # and metadata primary keys
    ((), "version", ("id",), ()),
])
def test_written_metadata(selected, order_field, primary_keys, expected):
    assert written_metadata(selected, order_field, primary_keys) == expected


def test_only_the_written_columns_follow_the_fields_and_offset_always_does():
    table = with_metadata(pa.table({"id": [1, 2]}), raw(), ("_timestamp", "_headers"), "string")
    assert table.column_names == ["id", "_offset", "_timestamp", "_headers"]
    assert table.column("_headers").to_pylist() == [None, '{"h":"v"}']
    assert table.schema.field("_timestamp").type == pa.timestamp("ms", tz="UTC")


def test_every_column_per_key_format():
    table = with_metadata(pa.table({"id": [1, 2]}), raw(), METADATA_COLUMNS, "raw")
    assert table.column_names == ["id", *METADATA_COLUMNS]
    assert table.column("_key").to_pylist() == [b"k", b"k"]
    assert table.column("_partition").to_pylist() == [1, 1]


def test_offset_is_left_out_of_files_only_when_not_written():
    assert DecodeSpec(None, (), "_offset", metadata_columns=()).unstored_columns == ()
    assert DecodeSpec(None, (), "version", metadata_columns=("_key",)).unstored_columns == ("_offset",)


def test_a_row_setting_a_reserved_field_is_a_bad_record_and_the_column_goes():
    fields = pa.table({"id": [1, 2, 3], "_headers": [None, "x", None], "_deleted": [True, None, None]})
    kept, failures = split_reserved(fields, (*METADATA_COLUMNS, "_deleted"))
    assert kept.column_names == ["id"]
    assert {row: kind for row, (_, kind) in failures.items()} == {0: "reserved_field", 1: "reserved_field"}
    kept, failures = split_reserved(fields.select(["id", "_deleted"]), METADATA_COLUMNS)
    assert kept.column_names == ["id", "_deleted"] and failures == {}
