"""SINK_TRANSFORM_SQL in DuckDB's dialect: the statement (Spark SQL, checked by `check.py`) as
DuckDB runs it over a chunk of these column types (`rows.py` caches it per schema)."""

from __future__ import annotations

import logging

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.optimizer.annotate_types import annotate_types

ENV = "SINK_TRANSFORM_SQL"
log = logging.getLogger(__name__)


class SparkAnsi(Spark):
    """Spark 4's default (spark.sql.ansi.enabled=true): `CAST` fails on a value it cannot convert."""

    class Parser(Spark.Parser):
        STRICT_CAST = True


def _source_name(statement: exp.Select) -> str:
    return statement.args["from_"].this.alias_or_name


_INTEGERS = (exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT, exp.DataType.Type.BIGINT)
_FRACTIONAL = (exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE, exp.DataType.Type.DECIMAL)


def duckdb_sql(statement: str, columns: pa.Schema) -> str:
    """The statement in DuckDB's dialect for rows of these columns (`transform.py` caches it per schema).

    Spark casts a fractional number to an integer type by truncating (`CAST(2.7 AS INT)` is 2);
    DuckDB rounds (3). Where the operand's type is known from the columns (sqlglot's type
    annotation: a column, a literal, arithmetic on them), the cast is written over `trunc` of it.
    """
    original = sqlglot.parse_one(statement, read=SparkAnsi)
    typed = original.copy()  # qualified to find types; the original keeps lateral aliases unqualified
    source = _source_name(typed)
    for column in typed.find_all(exp.Column):
        if not column.table:
            column.set("table", exp.to_identifier(source))
    types = {name: _sql_type(type_) for name, type_ in zip(columns.names, columns.types, strict=True)}
    try:
        annotate_types(typed, schema={source: types}, dialect=SparkAnsi)
    except Exception:  # sqlglot could not type it: DuckDB's rounding stays (documented), never a record's fault
        log.warning("%s: operand types unknown, integer casts round as in DuckDB", ENV, exc_info=True)
        return original.sql(dialect="duckdb")
    for cast, typed_cast in zip(original.find_all(exp.Cast), typed.find_all(exp.Cast), strict=True):
        operand = typed_cast.this.type
        if cast.to.is_type(*_INTEGERS) and operand is not None and operand.is_type(*_FRACTIONAL):
            cast.set("this", exp.Anonymous(this="trunc", expressions=[cast.this]))
    return original.sql(dialect="duckdb")


def _sql_type(type_: pa.DataType) -> str:
    """The Arrow types whose casts differ, in sqlglot's names; the rest are unknown to it."""
    if pa.types.is_floating(type_):
        return "DOUBLE"
    if pa.types.is_decimal(type_):
        return f"DECIMAL({type_.precision}, {type_.scale})"
    if pa.types.is_integer(type_):
        return "BIGINT"
    return "VARCHAR" if pa.types.is_string(type_) or pa.types.is_large_string(type_) else "UNKNOWN"
