"""SINK_TRANSFORM_SQL: a row-wise Spark SQL `SELECT … FROM records` over each decoded segment.

The statement is written in Spark SQL, parsed by sqlglot (with Spark 4's ANSI `CAST`: a value that
does not convert is an error, not NULL) and run by DuckDB over the segment's Arrow table inside
the task, so records still never enter the JVM (see ARCHITECTURE.md, "Why these choices").
Only row-wise statements are allowed: each output row comes from one input row, so files, offsets
and commits follow the thresholds exactly as without a transform. `_offset` is always carried
through (appended when the projection leaves it out): files are named and committed by it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark

from sink_service.decode.metadata import OFFSET

TABLE = "records"

# Constructs that combine or multiply rows, or read other tables: not row-wise.
_REJECTED: tuple[tuple[type[exp.Expression], str], ...] = (
    (exp.Join, "a join"),
    (exp.Lateral, "LATERAL VIEW"),
    (exp.Explode, "explode (one row per element)"),
    (exp.Unnest, "UNNEST"),
    (exp.AggFunc, "an aggregate function"),
    (exp.Group, "GROUP BY"),
    (exp.Having, "HAVING"),
    (exp.Window, "a window function"),
    (exp.Qualify, "QUALIFY"),
    (exp.Order, "ORDER BY"),
    (exp.Cluster, "CLUSTER BY"),
    (exp.Distribute, "DISTRIBUTE BY"),
    (exp.Sort, "SORT BY"),
    (exp.Limit, "LIMIT"),
    (exp.Offset, "OFFSET"),
    (exp.Distinct, "DISTINCT"),
    (exp.With, "WITH (a common table expression)"),
    (exp.SetOperation, "UNION/INTERSECT/EXCEPT"),
    (exp.TableSample, "TABLESAMPLE"),
)


class SparkAnsi(Spark):
    """Spark 4's default (spark.sql.ansi.enabled=true): `CAST` fails on a value it cannot convert."""

    class Parser(Spark.Parser):
        STRICT_CAST = True


class TransformFailed(ValueError):
    """The statement failed on these rows (e.g. a CAST of a value that does not convert): the
    records are to blame, so the task bisects to them (a ValueError, like other data errors)."""


@dataclass(frozen=True)
class Transform:
    """The validated statement; pickled into task specs (the engine is per worker)."""

    spark_sql: str
    duckdb_sql: str

    def apply(self, rows: pa.Table) -> pa.Table:
        """The statement's output over `rows` (in their order); raises `TransformFailed`."""
        con = _connection()
        con.register(TABLE, rows)
        try:
            return con.sql(self.duckdb_sql).to_arrow_table()
        except Exception as exc:  # DuckDB's errors: conversion, out of range, invalid input...
            raise TransformFailed(f"SINK_TRANSFORM_SQL failed: {_first_line(exc)}") from exc
        finally:
            con.unregister(TABLE)


def compile_transform(sql: str, order_field: str, primary_keys: Iterable[str]) -> Transform:
    """The statement checked and transpiled to DuckDB; `TransformInvalid` lists every problem."""
    problems, statement = _parsed(sql)
    if statement is not None:
        problems += _row_wise_problems(statement)
        problems += _kept_column_problems(statement, order_field, tuple(primary_keys))
    if problems:
        raise TransformInvalid(problems)
    if not _keeps(statement, OFFSET):
        statement = statement.select(exp.column(OFFSET, table=_source_name(statement)), copy=True)
    return Transform(sql, statement.sql(dialect="duckdb"))


class TransformInvalid(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def check_against(transform: Transform, sample: pa.Table) -> list[str]:
    """Problems DuckDB finds running the statement over `sample` (no rows: unknown columns,
    functions or types), e.g. from a declared value schema."""
    try:
        transform.apply(sample)
    except TransformFailed as exc:
        return [str(exc)]
    return []


def _parsed(sql: str) -> tuple[list[str], exp.Select | None]:
    try:
        statements = [s for s in sqlglot.parse(sql, read=SparkAnsi) if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        return [f"SINK_TRANSFORM_SQL is not valid Spark SQL: {_first_line(exc)}"], None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        return [f"SINK_TRANSFORM_SQL must be one `SELECT … FROM {TABLE}` statement."], None
    return [], statements[0]


def _row_wise_problems(statement: exp.Select) -> list[str]:
    problems = []
    for kind, name in _REJECTED:
        if statement.find(kind) is not None:
            problems.append(f"SINK_TRANSFORM_SQL uses {name}; only row-wise statements are allowed (each output "
                            f"row from one record of `{TABLE}`).")
    if any(select is not statement for select in statement.find_all(exp.Select)):
        problems.append("SINK_TRANSFORM_SQL has a subquery; only row-wise statements over "
                        f"`{TABLE}` are allowed.")
    tables = {t.name for t in statement.find_all(exp.Table)}
    source = statement.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or tables != {TABLE}:
        problems.append(f"SINK_TRANSFORM_SQL must read only from `{TABLE}` (the decoded rows), "
                        f"found {', '.join(sorted(tables)) or 'no table'}.")
    return problems


def _kept_column_problems(statement: exp.Select, order_field: str, primary_keys: tuple[str, ...]) -> list[str]:
    """The order column and the primary keys must come out; `_offset` only as itself."""
    problems = []
    offset = [e for e in statement.expressions if e.alias_or_name == OFFSET]
    if any(not isinstance(e, exp.Column) for e in offset):
        problems.append(f"SINK_TRANSFORM_SQL computes `{OFFSET}`: it is the Kafka offset that names files and "
                        "commits, so it may only be selected as it is.")
    for env, name in [("SINK_ORDER_FIELD", order_field)] + [("SINK_PRIMARY_KEYS", k) for k in primary_keys]:
        if not _keeps(statement, name):
            problems.append(f"SINK_TRANSFORM_SQL drops `{name}` ({env}); select it (e.g. `SELECT *, …` or "
                            f"`SELECT {name}, …`): every row needs it.")
    return problems


def _keeps(statement: exp.Select, name: str) -> bool:
    """Whether a column of this name comes out: named, or under a `*` that does not exclude it."""
    for e in statement.expressions:
        star = e if isinstance(e, exp.Star) else e.this if isinstance(e, exp.Column) else None
        if isinstance(star, exp.Star):
            if name not in {c.alias_or_name for c in star.args.get("except_") or ()}:
                return True
        elif e.alias_or_name == name:
            return True
    return False


def _source_name(statement: exp.Select) -> str:
    return statement.args["from_"].this.alias_or_name


def _first_line(exc: BaseException) -> str:
    """Engine messages carry a caret drawing of the statement: the first line names the problem."""
    return str(exc).strip().splitlines()[0]


_local = threading.local()


def _connection():
    """One in-memory DuckDB per worker thread, reused across chunks (a connection costs ~ms)."""
    con = getattr(_local, "con", None)
    if con is None:
        import duckdb

        con = _local.con = duckdb.connect(":memory:", config={"threads": 1})
    return con
