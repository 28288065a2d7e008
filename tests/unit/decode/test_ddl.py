"""Spark DDL field lists to Arrow schemas."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sink_service.shared.ddl import DdlError, parse_ddl


@pytest.mark.parametrize("ddl, expected", [
    ("a STRING", pa.string()),
    ("a INT", pa.int32()),
    ("a BIGINT", pa.int64()),
    ("a DOUBLE", pa.float64()),
    ("a BOOLEAN", pa.bool_()),
    ("a DECIMAL(10,2)", pa.decimal128(10, 2)),
    ("a DECIMAL( 10 , 2 )", pa.decimal128(10, 2)),
    ("a DECIMAL", pa.decimal128(10, 0)),
    ("a TIMESTAMP", pa.timestamp("us", tz="UTC")),
    ("a TIMESTAMP_NTZ", pa.timestamp("us")),
    ("a DATE", pa.date32()),
    ("a VARCHAR(20)", pa.string()),
    ("a ARRAY<STRING>", pa.list_(pa.string())),
    ("a STRUCT<a: INT, b: STRING>", pa.struct([("a", pa.int32()), ("b", pa.string())])),
    ("a STRUCT<x INT, y ARRAY<STRUCT<z: DOUBLE>>>",
     pa.struct([("x", pa.int32()), ("y", pa.list_(pa.struct([("z", pa.float64())])))])),
    ("a string", pa.string()),
    ("a Array<Int>", pa.list_(pa.int32())),
])
def test_types(ddl, expected):
    schema = parse_ddl(ddl)
    assert schema.names == ["a"]
    assert schema.field("a").type == expected
    assert schema.field("a").nullable


def test_several_fields_keep_their_order_and_names():
    schema = parse_ddl("id STRING, amount DECIMAL(10,2), tags ARRAY<STRING>, updated_at TIMESTAMP")
    assert schema.names == ["id", "amount", "tags", "updated_at"]
    assert schema.field("amount").type == pa.decimal128(10, 2)


def test_backquoted_names():
    schema = parse_ddl("`order id` STRING, `weird``name` INT, `select` BIGINT")
    assert schema.names == ["order id", "weird`name", "select"]
    assert schema.field("order id").type == pa.string()


def test_field_names_keep_their_case():
    assert parse_ddl("OrderId STRING").names == ["OrderId"]


def test_not_null():
    schema = parse_ddl("id STRING NOT NULL, amount DOUBLE, s STRUCT<a: INT NOT NULL>")
    assert not schema.field("id").nullable
    assert schema.field("amount").nullable
    assert not schema.field("s").type.field("a").nullable


def test_colon_syntax():
    schema = parse_ddl("a: int, b : string")
    assert schema.names == ["a", "b"]
    assert schema.types == [pa.int32(), pa.string()]


def test_whitespace_and_newlines_are_ignored():
    schema = parse_ddl("\n  id   STRING,\n\tamount\tDOUBLE\n")
    assert schema.names == ["id", "amount"]


def _error(ddl: str) -> str:
    with pytest.raises(DdlError) as info:
        parse_ddl(ddl)
    return str(info.value)


def test_unknown_type_names_the_type():
    message = _error("id STRING, amount MONEY")
    assert "unknown type" in message
    assert "money" in message.lower()


def test_unknown_nested_type_names_the_type():
    assert "strng" in _error("tags ARRAY<STRNG>").lower()


def test_trailing_comma():
    assert "end of schema" in _error("id STRING, amount DOUBLE,")


def test_missing_comma_names_the_field():
    message = _error("id STRING amount DOUBLE")
    assert "'id'" in message
    assert "'amount'" in message


def test_duplicate_fields_are_named():
    assert "amount" in _error("amount DOUBLE, id STRING, amount STRING")


@pytest.mark.parametrize("ddl", ["", "   ", "\n"])
def test_empty_schema(ddl):
    assert "empty" in _error(ddl)


def test_unexpected_character_reports_position():
    message = _error("id STRING; amount DOUBLE")
    assert "';'" in message
    assert "position 9" in message


def test_missing_type():
    assert "end of schema" in _error("id")


def test_unclosed_generic():
    assert "end of schema" in _error("tags ARRAY<STRING")


def test_unclosed_backquote():
    assert "'`'" in _error("`id STRING")


def test_incomplete_not_null():
    assert "end of schema" in _error("id STRING NOT")


def test_comment_clause_is_rejected():
    # COMMENT is unsupported; the error must at least point at the clause.
    message = _error("id STRING COMMENT 'the id'")
    assert "COMMENT" in message or "position 18" in message


@pytest.mark.parametrize("ddl", ["a DECIMAL(40,2)", "a DECIMAL(0)", "a DECIMAL(abc)", "a DECIMAL(10,x)"])
def test_invalid_decimal_is_a_ddl_error(ddl):
    # Spark allows precision 1..38; anything else must be a DdlError (which configuration
    # validation reports), not a bare ValueError from pyarrow or int().
    _error(ddl)


@pytest.mark.parametrize("ddl", ["( INT", ": STRING", "> BIGINT", "id STRING, , amount DOUBLE"])
def test_punctuation_is_not_a_field_name(ddl):
    _error(ddl)


def test_map_is_rejected_with_advice():
    with pytest.raises(DdlError, match="STRUCT"):
        parse_ddl("a MAP<STRING,INT>")
