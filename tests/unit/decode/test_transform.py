"""SINK_TRANSFORM_SQL: Spark SQL checked by sqlglot, run by DuckDB over decoded Arrow rows."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from sink_service.transform.check import TransformInvalid, compile_transform
from sink_service.transform.rows import Transform, TransformFailed

METADATA = pa.schema([("_key", pa.string()), ("_offset", pa.int64()), ("_timestamp", pa.timestamp("ms", tz="UTC"))])
DECLARED = pa.schema([("id", pa.string()), ("amount", pa.string()), ("status", pa.string()),
                      ("customer", pa.struct([("name", pa.string())])), *METADATA])


def rows(*records: dict) -> pa.Table:
    """Decoded rows as the decode stage hands them over: the declared columns plus metadata."""
    filled = [{"_key": f"k{i}", "_offset": 10 + i, "_timestamp": 1_700_000_000_000 + i, **r}
              for i, r in enumerate(records)]
    return pa.Table.from_pylist(filled, schema=DECLARED)


def compiled(sql: str, *, primary_keys: tuple[str, ...] = ("id",), order_field: str = "_offset",
             complete: bool = True) -> Transform:
    return compile_transform(sql, order_field=order_field, primary_keys=primary_keys, columns=DECLARED,
                             complete=complete, reserved=("_key", "_offset", "_timestamp", "_headers"))


def problems(sql: str, **kwargs) -> list[str]:
    with pytest.raises(TransformInvalid) as info:
        compiled(sql, **kwargs)
    return info.value.problems


SAMPLE = rows({"id": "a", "amount": "12", "status": "paid", "customer": {"name": "Ann"}},
              {"id": "b", "amount": "7", "status": "test", "customer": None},
              {"id": "c", "amount": "-3", "status": "open", "customer": {"name": "Cy"}})


def test_rename_keeps_the_values_and_carries_the_offset_through():
    out = compiled("SELECT id AS order_id, status FROM records", primary_keys=("order_id",)).apply(SAMPLE)
    assert out.column_names == ["order_id", "status", "_offset"]  # `_offset` appended: files are named by it
    assert out.column("order_id").to_pylist() == ["a", "b", "c"]
    assert out.column("_offset").to_pylist() == [10, 11, 12]


def test_where_filters_rows_and_keeps_their_order():
    out = compiled("SELECT * FROM records WHERE status <> 'test'").apply(SAMPLE)
    assert out.column("id").to_pylist() == ["a", "c"]
    assert out.column("_offset").to_pylist() == [10, 12]


def test_computed_column_and_struct_field():
    out = compiled("SELECT id, upper(customer.name) AS name, concat(id, '-', status) AS tag FROM records").apply(SAMPLE)
    assert out.column("name").to_pylist() == ["ANN", None, "CY"]
    assert out.column("tag").to_pylist() == ["a-paid", "b-test", "c-open"]


def test_cast_gives_the_declared_type():
    out = compiled("SELECT id, CAST(amount AS INT) AS amount, CAST(amount AS DECIMAL(10,2)) AS exact "
                   "FROM records").apply(SAMPLE)
    assert out.schema.field("amount").type == pa.int32()
    assert out.column("amount").to_pylist() == [12, 7, -3]
    assert out.schema.field("exact").type == pa.decimal128(10, 2)


def test_select_star_keeps_offset_and_metadata_types():
    out = compiled("SELECT * FROM records").apply(SAMPLE)
    assert out.schema == SAMPLE.schema  # `_timestamp` stays milliseconds UTC though DuckDB works in micros
    assert out.to_pylist() == SAMPLE.to_pylist()


def test_an_ansi_cast_that_does_not_convert_fails_with_the_engines_message():
    transform = compiled("SELECT id, CAST(amount AS INT) AS amount FROM records")
    with pytest.raises(TransformFailed, match=r"SINK_TRANSFORM_SQL failed: Conversion Error: .*'abc'"):
        transform.apply(rows({"id": "x", "amount": "abc"}))


def test_a_fractional_number_cast_to_an_integer_is_truncated_as_in_spark():
    """DuckDB rounds (2.7 -> 3, 2.5 -> 2); Spark truncates toward zero. Written over `trunc` where
    sqlglot knows the operand is fractional: a column, a literal, arithmetic on them."""
    table = pa.table({"id": ["a", "b", "c"], "price": [2.7, -2.7, 2.5], "exact": pa.array(
        ["2.50", "-2.50", "0.99"]).cast(pa.decimal128(5, 2)), "_offset": pa.array([1, 2, 3], pa.int64())})
    transform = compile_transform(
        "SELECT id, CAST(price AS INT) AS p, CAST(price * 2 AS BIGINT) AS p2, CAST(exact AS INT) AS e, "
        "CAST(2.5 AS SMALLINT) AS lit, CAST(CAST(price AS STRING) AS INT) AS via_text FROM records",
        order_field="_offset", primary_keys=("id",), columns=table.schema, complete=True)
    out = transform.apply(table)
    assert out.column("p").to_pylist() == [2, -2, 2]
    assert out.column("p2").to_pylist() == [5, -5, 5]
    assert out.column("e").to_pylist() == [2, -2, 0]
    assert out.column("lit").to_pylist() == [2, 2, 2]
    assert out.column("via_text").to_pylist() == [3, -3, 3]  # text is DuckDB's: rounded (Spark fails)


def test_try_cast_gives_null_instead():
    transform = compiled("SELECT id, TRY_CAST(amount AS INT) AS amount FROM records")
    out = transform.apply(rows({"id": "x", "amount": "abc"}))
    assert out.column("amount").to_pylist() == [None]


@pytest.mark.parametrize(("sql", "named"), [
    ("SELECT r.* FROM records r JOIN records s ON r.id = s.id", "a join"),
    ("SELECT id, count(*) AS n, max(_offset) AS _o FROM records GROUP BY id", "GROUP BY"),
    ("SELECT id, sum(CAST(amount AS INT)) AS total FROM records", "an aggregate function"),
    ("SELECT *, row_number() OVER (PARTITION BY id ORDER BY _offset) AS n FROM records", "a window function"),
    ("SELECT * FROM records WHERE id IN (SELECT id FROM records WHERE status = 'paid')", "a subquery"),
    ("SELECT * FROM records LIMIT 10", "LIMIT"),
    ("SELECT * FROM records ORDER BY id", "ORDER BY"),
    ("SELECT DISTINCT * FROM records", "DISTINCT"),
    ("SELECT *, explode(array(1, 2)) AS e FROM records", "explode"),
    ("SELECT * FROM records UNION ALL SELECT * FROM records", "UNION"),
    ("WITH x AS (SELECT * FROM records) SELECT * FROM x", "WITH"),
])
def test_constructs_that_are_not_row_wise_are_rejected_by_name(sql, named):
    found = problems(sql)
    assert any(named in p and p.startswith("SINK_TRANSFORM_SQL") for p in found), found


def test_other_tables_and_other_statements_are_rejected():
    assert any("must read only from `records`" in p for p in problems("SELECT * FROM orders"))
    assert problems("DELETE FROM records") == ["SINK_TRANSFORM_SQL must be one `SELECT … FROM records` statement."]
    assert problems("SELECT * FROM records; SELECT * FROM records")[0].startswith("SINK_TRANSFORM_SQL must be one")


def test_dropping_a_primary_key_or_the_order_column_is_rejected():
    found = problems("SELECT status, _offset FROM records", primary_keys=("id",), order_field="_timestamp")
    assert any("drops `id` (SINK_PRIMARY_KEYS)" in p for p in found), found
    assert any("drops `_timestamp` (SINK_ORDER_FIELD)" in p for p in found), found
    assert any("drops `id`" in p for p in problems("SELECT * EXCEPT (id) FROM records"))


def test_the_offset_may_not_be_computed_or_renamed():
    assert any("computes `_offset`" in p for p in problems("SELECT id, _offset + 1 AS _offset FROM records"))
    assert any("renames `_offset`" in p for p in problems("SELECT id, _offset AS pos FROM records"))


def test_invalid_sql_shows_the_parsers_message():
    [problem] = problems("SELECT id, FROM records WHERE")
    assert problem.startswith("SINK_TRANSFORM_SQL is not valid Spark SQL: ")
    assert len(problem) > len("SINK_TRANSFORM_SQL is not valid Spark SQL: ") + 10


def test_what_duckdb_rejects_over_the_declared_columns_shows_its_message():
    [unknown] = problems("SELECT id, amout FROM records")
    assert unknown.startswith("SINK_TRANSFORM_SQL does not run: Binder Error") and '"amout"' in unknown
    [function] = problems("SELECT id, no_such_function(amount) AS x FROM records")
    assert "no_such_function" in function and "Catalog Error" in function
    [twice] = problems("SELECT *, upper(id) AS id FROM records")
    assert "more than one column named id" in twice


def test_a_metadata_column_that_is_not_written_is_named():
    columns = pa.schema([f for f in DECLARED if f.name != "_key"])
    with pytest.raises(TransformInvalid, match="reads `_key`, which SINK_METADATA_COLUMNS does not write"):
        compile_transform("SELECT *, _key AS k FROM records", order_field="_offset", primary_keys=("id",),
                          columns=columns, complete=False, reserved=("_key",))


def test_without_a_declared_schema_a_field_no_record_of_the_chunk_has_reads_as_null():
    """With inferred schemas a chunk lacks the columns of fields none of its records set: as in a
    record that lacks the field, the statement reads NULL there instead of failing every record."""
    transform = compiled("SELECT id, CAST(discount AS INT) AS discount FROM records", complete=False)
    out = transform.apply(rows({"id": "a"}))
    assert out.column("discount").to_pylist() == [None]
    with pytest.raises(TransformInvalid, match='"discount"'):  # a declared schema says it never comes
        compiled("SELECT id, CAST(discount AS INT) AS discount FROM records", complete=True)


def test_the_compiled_transform_survives_pickling_into_task_specs():
    transform = compiled("SELECT * FROM records WHERE status = 'paid'")
    assert pickle.loads(pickle.dumps(transform)).apply(SAMPLE).column("id").to_pylist() == ["a"]
    failed = pickle.loads(pickle.dumps(TransformFailed("Conversion Error: x")))
    assert str(failed) == "SINK_TRANSFORM_SQL failed: Conversion Error: x"
