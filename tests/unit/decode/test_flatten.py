"""Flat rows (SINK_FLATTEN): nested objects as `parent_child` columns, arrays as JSON, collisions."""

from __future__ import annotations

import datetime
import decimal
import json

import pyarrow as pa
import pytest

from sink_service.config import load_config
from sink_service.decode.flatten import FieldCollision, flatten
from sink_service.shared.column_names import column_name
from tests.support.config_helpers import config_problems, ems_env

METADATA = ("_key", "_offset")


def flat(table: pa.Table, *, metadata=METADATA, discard_collections=False, lowercase=False,
         decimals_as_double=False) -> pa.Table:
    return flatten(table, metadata=metadata, discard_collections=discard_collections, lowercase=lowercase,
                   decimals_as_double=decimals_as_double)


def test_nested_objects_become_parent_child_columns_recursively():
    table = pa.Table.from_pylist([
        {"id": 1, "customer": {"name": "Ann", "address": {"zip": "1010", "city": "Wien"}}},
        {"id": 2, "customer": {"name": "Bob", "address": None}},
        {"id": 3, "customer": None},
    ])
    result = flat(table)
    assert result.column_names == ["id", "customer_name", "customer_address_zip", "customer_address_city"]
    assert result.to_pylist() == [
        {"id": 1, "customer_name": "Ann", "customer_address_zip": "1010", "customer_address_city": "Wien"},
        {"id": 2, "customer_name": "Bob", "customer_address_zip": None, "customer_address_city": None},
        {"id": 3, "customer_name": None, "customer_address_zip": None, "customer_address_city": None},
    ]


def test_a_null_object_nulls_its_columns_whatever_its_children_hold():
    # Arrow may keep child values under a null struct; they are not the record's.
    customer = pa.StructArray.from_arrays([pa.array(["Ann", "stale"])], names=["name"],
                                          mask=pa.array([False, True]))
    assert flat(pa.table({"customer": customer})).column("customer_name").to_pylist() == ["Ann", None]


def test_a_flat_table_passes_unchanged():
    table = pa.table({"id": ["a", "b"], "amount": [1.5, 2.0], "_key": ["k1", None], "_offset": [7, 8]})
    assert flat(table).equals(table)


@pytest.mark.parametrize(("path", "name"), [
    (["order-id"], "order_id"),
    (["Größe"], "Gr__e"),
    (["a.b"], "a_b"),
    (["customer", "e mail"], "customer_e_mail"),
    (["9lives"], "9lives"),
    ([""], "_"),
])
def test_names_keep_only_letters_digits_and_underscores(path, name):
    assert column_name(path, lowercase=False) == name
    value: object = 1
    for step in reversed(path[1:]):
        value = {step: value}
    table = pa.table({path[0]: pa.array([value])})
    assert flat(table).column_names == [name]


def test_lowercase_applies_to_every_value_column():
    table = pa.Table.from_pylist([{"OrderId": 1, "Customer": {"EMail": "a@x"}}])
    assert flat(table, lowercase=True).column_names == ["orderid", "customer_email"]


def test_metadata_columns_pass_unchanged_whatever_their_type():
    headers = pa.array([[{"k": "h", "v": "1"}]], pa.list_(pa.struct([("k", pa.string()), ("v", pa.string())])))
    table = pa.table({"id": [1], "_headers": headers, "_Key": ["K"]})
    result = flat(table, metadata=("_headers", "_Key"), lowercase=True)
    assert result.column("_headers").equals(table.column("_headers"))
    assert result.column_names == ["id", "_headers", "_Key"]


def test_arrays_become_compact_json_and_nulls_stay_null():
    rows = [
        {"tags": ["a", None, 'say "hi"\\'], "items": [{"sku": "x", "qty": 2}, {"sku": None, "qty": 3}],
         "matrix": [[1, 2], [], None], "flags": [True, False]},
        {"tags": [], "items": None, "matrix": None, "flags": None},
    ]
    result = flat(pa.Table.from_pylist(rows)).to_pylist()
    assert result[0] == {
        "tags": '["a",null,"say \\"hi\\"\\\\"]',
        "items": '[{"sku":"x","qty":2},{"qty":3}]',  # null fields are left out, as the lattice does
        "matrix": "[[1,2],[],null]",
        "flags": "[true,false]",
    }
    assert result[1] == {"tags": "[]", "items": None, "matrix": None, "flags": None}


def test_an_object_in_an_array_whose_fields_are_all_null_is_an_empty_object():
    items = pa.array([[{"a": None, "b": None}, None, {"a": 1, "b": None}], [{"a": None, "b": None}]],
                     pa.list_(pa.struct([("a", pa.int64()), ("b", pa.string())])))
    assert flat(pa.table({"items": items})).column("items").to_pylist() == ['[{},null,{"a":1}]', "[{}]"]


@pytest.mark.parametrize("text", [
    "line\nbreak\ttab\rcr", "nul\x00and\x1fus", "bell\x07\x08\x0c", "ünïcödé ✓ 😀", "back\\slash \"quoted\"", "",
])
def test_strings_inside_arrays_are_valid_json_with_the_same_text(text):
    result = flat(pa.table({"notes": [[text, text[::-1]]], "_offset": [1]}))
    encoded = result.column("notes")[0].as_py()
    assert json.loads(encoded) == [text, text[::-1]]
    assert encoded == json.dumps([text, text[::-1]], ensure_ascii=False, separators=(",", ":"))


def test_numbers_inside_arrays_keep_their_values():
    values = [0.1, 1e16, -2.5e-7, 123456789.125, 3.0]
    decimals = [decimal.Decimal("12345678901234567890123"), decimal.Decimal("-1")]
    table = pa.table({"d": pa.array([values]), "big": pa.array([decimals], pa.list_(pa.decimal128(38, 0)))})
    result = flat(table).to_pylist()[0]
    assert json.loads(result["d"]) == values
    assert json.loads(result["big"]) == [int(d) for d in decimals]


def test_rare_types_inside_arrays_are_written_as_the_lattice_writes_them():
    stamp = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    table = pa.table({"at": pa.array([[stamp, None]], pa.list_(pa.timestamp("ms", tz="UTC")))})
    assert json.loads(flat(table).column("at")[0].as_py()) == ["2024-01-02 03:04:05+00:00", None]


def test_discarding_collections_drops_array_columns_only():
    table = pa.Table.from_pylist([{"id": 1, "tags": ["a"], "c": {"items": [1], "n": 2}}])
    assert flat(table, discard_collections=True).to_pylist() == [{"id": 1, "c_n": 2}]


def test_decimals_become_doubles_on_request():
    amounts = pa.array([decimal.Decimal("1.25"), None], pa.decimal128(10, 2))
    table = pa.table({"amount": amounts, "n": pa.array([{"big": decimal.Decimal(2**70)}, None],
                                                        pa.struct([("big", pa.decimal128(38, 0))]))})
    result = flat(table, decimals_as_double=True)
    assert result.schema.types == [pa.float64(), pa.float64()]
    assert result.to_pylist() == [{"amount": 1.25, "n_big": float(2**70)}, {"amount": None, "n_big": None}]
    assert flat(table).schema.types == [pa.decimal128(10, 2), pa.decimal128(38, 0)]


def test_fields_that_become_one_name_share_the_column_with_their_types_joined():
    table = pa.Table.from_pylist([
        {"a": {"b": 1}, "a_b": None},
        {"a": {"b": None}, "a_b": "x"},
        {"a": None, "a_b": None},
    ])
    result = flat(table)
    assert result.to_pylist() == [{"a_b": "1"}, {"a_b": "x"}, {"a_b": None}]


def test_sharing_a_column_does_not_depend_on_how_records_are_chunked():
    rows = [{"a": {"b": 1}}, {"a_b": 2}, {"a": {"b": 3}}, {"a_b": 4}]
    whole = flat(pa.Table.from_pylist(rows, schema=pa.schema([("a", pa.struct([("b", pa.int64())])),
                                                              ("a_b", pa.int64())])))
    apart = [flat(pa.Table.from_pylist([row])) for row in rows]  # each chunk holds one of the fields
    assert whole.column("a_b").to_pylist() == [t.column("a_b")[0].as_py() for t in apart] == [1, 2, 3, 4]


def test_a_record_holding_two_fields_of_one_column_is_a_bad_record_naming_both():
    table = pa.Table.from_pylist([
        {"a": {"b": 1}, "a_b": None},
        {"a": {"b": 2}, "a_b": "x"},
        {"a": None, "a_b": "y"},
        {"a": {"b": 4}, "a_b": "z"},
    ])
    with pytest.raises(FieldCollision) as info:
        flat(table)
    failures = info.value.failures
    assert sorted(failures) == [1, 3]
    reason, kind = failures[1]
    assert kind == "field_collision"
    assert "`a.b`" in reason and "`a_b`" in reason and "column `a_b`" in reason
    assert isinstance(info.value, ValueError)  # unhandled, it is still a data error of the records
    rest = table.filter(pa.array([row not in failures for row in range(table.num_rows)]))
    assert flat(rest).to_pylist() == [{"a_b": "1"}, {"a_b": "y"}]


def test_lowercasing_can_make_fields_collide():
    table = pa.Table.from_pylist([{"Id": 1, "id": None}, {"Id": 2, "id": 3}])
    with pytest.raises(FieldCollision) as info:
        flat(table, lowercase=True)
    assert list(info.value.failures) == [1]
    assert "`Id` and `id`" in info.value.failures[1][0]
    assert flat(table).column_names == ["Id", "id"]


def test_a_field_may_never_fill_a_metadata_column():
    table = pa.table({"": pa.array([{"key": None}, {"key": "sneaky"}]), "_key": ["k1", None]})
    with pytest.raises(FieldCollision) as info:
        flat(table)
    assert info.value.failures == {1: (
        'field `"".key` becomes column `_key` when flattened, which is a metadata column', "reserved_field")}
    assert flat(table.slice(0, 1)).to_pylist() == [{"_key": "k1"}]


def test_flattening_is_on_by_default_for_ems_only():
    assert load_config(ems_env()).flatten is True
    assert load_config(ems_env(SINK_TARGET="dir", SINK_DIR_PATH="/tmp/out")).flatten is False
    assert load_config(ems_env(SINK_TARGET="dir", SINK_DIR_PATH="/tmp/out", SINK_FLATTEN="true")).flatten is True
    assert load_config(ems_env(SINK_FLATTEN="false")).flatten is False
    assert load_config(ems_env()).masked()["SINK_FLATTEN"] is True  # the startup dump shows the effective value


def test_flat_only_options_without_flattening_are_each_a_problem():
    problems = config_problems(ems_env(SINK_FLATTEN="false", SINK_FLATTEN_DISCARD_COLLECTIONS="true",
                              SINK_LOWERCASE_FIELDS="true", SINK_DECIMALS_AS_DOUBLE="true"))
    for name in ("SINK_FLATTEN_DISCARD_COLLECTIONS", "SINK_LOWERCASE_FIELDS", "SINK_DECIMALS_AS_DOUBLE"):
        assert any(p.startswith(name) and "SINK_FLATTEN=true" in p for p in problems)


def test_keys_and_order_field_must_name_flattened_columns():
    problems = config_problems(ems_env(SINK_PRIMARY_KEYS="customer.id,Region", SINK_ORDER_FIELD="Version",
                              SINK_LOWERCASE_FIELDS="true"))
    assert any("`customer.id`" in p and "`customer_id`" in p for p in problems)
    assert any("`Region`" in p and "`region`" in p for p in problems)
    assert any(p.startswith("SINK_ORDER_FIELD") and "`version`" in p for p in problems)
    load_config(ems_env(SINK_PRIMARY_KEYS="customer.id", SINK_FLATTEN="false"))


def test_a_declared_schema_is_checked_by_its_flattened_columns():
    schema = "customer STRUCT<id: STRING, name: STRING>, version BIGINT"
    load_config(ems_env(SINK_VALUE_SCHEMA=schema, SINK_PRIMARY_KEYS="customer_id", SINK_ORDER_FIELD="version"))
    problems = config_problems(ems_env(SINK_VALUE_SCHEMA=schema, SINK_PRIMARY_KEYS="customer"))
    assert any("`customer`" in p and "SINK_VALUE_SCHEMA" in p for p in problems)
