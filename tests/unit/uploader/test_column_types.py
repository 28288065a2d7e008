"""The widening lattice: joins of types, and conversions that never change a value."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from uploader.column_types import conform, convert, join, join_schemas, unify, without_empty_structs

INT, F, S, B, D = pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.decimal128(38, 0)


def struct(**fields: pa.DataType) -> pa.StructType:
    return pa.struct(list(fields.items()))


@pytest.mark.parametrize("a, b, joined", [
    (pa.null(), INT, INT),
    (INT, F, F),
    (INT, D, D),
    (D, F, S),
    (B, INT, S),
    (B, F, S),
    (INT, S, S),
    (F, S, S),
    (B, S, S),
    (pa.int32(), INT, INT),
    (pa.float32(), F, F),
    (pa.decimal128(10, 2), INT, pa.decimal128(38, 2)),
    (pa.uint64(), INT, D),
    (struct(a=INT), struct(b=S), struct(a=INT, b=S)),
    (struct(a=INT, s=struct(x=INT)), struct(a=F, s=struct(x=S, y=B)), struct(a=F, s=struct(x=S, y=B))),
    (pa.list_(INT), pa.list_(F), pa.list_(F)),
    (pa.list_(pa.null()), pa.list_(struct(a=INT)), pa.list_(struct(a=INT))),
    (struct(a=INT), INT, S),
    (pa.list_(INT), INT, S),
    (pa.list_(INT), struct(a=INT), S),
    (pa.timestamp("us", "UTC"), pa.date32(), S),
])
def test_join(a, b, joined):
    assert join(a, b) == joined
    reverse = join(b, a)  # the same type either way, though struct fields may come in another order
    assert join(joined, reverse) == joined and join(reverse, joined) == reverse
    assert join(a, a) == a and join(joined, a) == joined and join(joined, b) == joined


def test_join_schemas_keeps_the_first_order_and_adds_new_fields_last():
    a = pa.schema([("x", INT), ("y", S)])
    b = pa.schema([("z", B), ("x", F)])
    assert join_schemas(a, b) == pa.schema([("x", F), ("y", S), ("z", B)])


@pytest.mark.parametrize("values, source, target, expected", [
    ([1, None, -3], INT, F, [1.0, None, -3.0]),
    ([1, 2], INT, D, [decimal.Decimal(1), decimal.Decimal(2)]),
    ([1, None], INT, S, ["1", None]),
    ([1.5, 1e16, 2.0], F, S, ["1.5", "1e+16", "2"]),
    ([True, False], B, S, ["true", "false"]),
    ([12345678901234567890], D, S, ["12345678901234567890"]),
    ([{"a": 1, "b": None}, None], struct(a=INT, b=S), S, ['{"a":1}', None]),
    ([[1, None], []], pa.list_(INT), S, ["[1,null]", "[]"]),
    ([None, None], pa.null(), INT, [None, None]),
    ([{"a": 1}, None], struct(a=INT), struct(a=F, b=S), [{"a": 1.0, "b": None}, None]),
    ([[1], None, []], pa.list_(INT), pa.list_(S), [["1"], None, []]),
])
def test_convert_keeps_every_value(values, source, target, expected):
    result = convert(pa.array(values, source), target)
    assert result.type == join(source, target)
    assert result.to_pylist() == expected


def test_a_value_with_no_exact_home_in_the_join_makes_the_field_text():
    result = convert(pa.array([0, 2**53 + 1]), F)
    assert result.type == S and result.to_pylist() == ["0", "9007199254740993"]
    nested = convert(pa.array([{"a": 2**53 + 1}]), struct(a=F))
    assert nested.type == struct(a=S) and nested.to_pylist() == [{"a": "9007199254740993"}]


def test_convert_of_sliced_nested_arrays():
    structs = pa.array([{"a": 1}, None, {"a": 3}]).slice(1)
    assert convert(structs, struct(a=F)).to_pylist() == [None, {"a": 3.0}]
    lists = pa.array([[1], [2, 3], None, [4]]).slice(1)
    assert convert(lists, pa.list_(S)).to_pylist() == [["2", "3"], None, ["4"]]


def test_conform_fills_missing_columns_orders_by_schema_and_keeps_extra_ones_last():
    schema = pa.schema([("a", INT), ("b", S), ("c", F)])
    result = conform(pa.table({"new": [True, False], "c": [1, 2], "a": [3, 4]}), schema)
    assert result.schema == pa.schema([("a", INT), ("b", S), ("c", F), ("new", B)])
    assert result.to_pylist() == [
        {"a": 3, "b": None, "c": 1.0, "new": True}, {"a": 4, "b": None, "c": 2.0, "new": False}]


def test_conform_never_narrows_or_drops_a_value():
    schema = pa.schema([("a", pa.int32()), ("x", struct(a=INT))])
    result = conform(pa.table({"a": [1.5, 2**40], "x": [{"a": 1, "b": "new"}, None]}), schema)
    assert result.column("a").to_pylist() == [1.5, 2.0**40]
    assert result.column("x").to_pylist() == [{"a": 1, "b": "new"}, None]


def test_conform_identity():
    table = pa.table({"a": [1, 2]})
    assert conform(table, table.schema).equals(table)


def test_unify_widens_until_every_value_fits():
    tables = [pa.table({"x": [0.5]}), pa.table({"x": [2**53 + 1]}), pa.table({"y": ["a"]})]
    unified = unify(tables)
    assert {t.schema for t in unified} == {pa.schema([("x", S), ("y", S)])}
    assert [row for t in unified for row in t.to_pylist()] == [
        {"x": "0.5", "y": None}, {"x": "9007199254740993", "y": None}, {"x": None, "y": "a"}]


def test_without_empty_structs():
    table = pa.table({
        "id": [1, 2, 3],
        "meta": pa.array([{}, {}, None], pa.struct([])),
        "s": pa.array([{"e": {}, "n": 1}, None, {"e": {}, "n": 3}]),
        "l": pa.array([[{}], [], None], pa.list_(pa.struct([]))),
    }).slice(1)
    result = without_empty_structs(table)
    assert result.schema == pa.schema([("id", INT), ("s", struct(n=INT)), ("l", pa.list_(pa.null()))])
    assert result.to_pylist() == [{"id": 2, "s": None, "l": []}, {"id": 3, "s": {"n": 3}, "l": None}]
    plain = pa.table({"a": [1]})
    assert without_empty_structs(plain) is plain


def test_without_empty_structs_keeps_the_rows_when_no_column_is_left():
    table = pa.table({"meta": pa.array([{}, {}], pa.struct([]))})
    assert without_empty_structs(table).num_rows == 2
