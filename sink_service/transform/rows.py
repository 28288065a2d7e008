"""SINK_TRANSFORM_SQL at run time: the compiled statement applied to each decoded segment.

The statement (written in Spark SQL, checked and transpiled at startup by `transform_sql.py`) is
run by DuckDB over the segment's Arrow table inside the task, so records still never enter the
JVM (see ARCHITECTURE.md, "Why these choices"). This module is what tasks unpickle: it imports
neither sqlglot nor DuckDB until a statement is applied, so without a transform nothing changes.
The DuckDB text depends on the chunk's column types (see `transform_sql.duckdb_sql`).

Only row-wise statements get here: each output row comes from one input row and keeps its
`_offset`, so files, offsets and commits follow the thresholds exactly as without a transform.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sink_service.shared.column_names import OFFSET

TABLE = "records"


class TransformFailed(ValueError):
    """The statement failed on these rows (e.g. a CAST of a value that does not convert): the
    records are to blame, so the task bisects to them (a ValueError, like other data errors).
    `engine`: DuckDB's own message, for startup errors."""

    def __init__(self, engine: str):
        super().__init__(engine)
        self.engine = engine

    def __str__(self) -> str:
        return f"SINK_TRANSFORM_SQL failed: {self.engine}"


@dataclass(frozen=True)
class Transform:
    """A checked statement; pickled into task specs (the DuckDB connection is per worker thread).

    `reads`: the top-level columns the statement reads. Without a declared schema a chunk has a
    column only if one of its records has the field, so a column it lacks reads as NULL, as a
    field that is absent from a record does.
    """

    spark_sql: str  # as configured
    statement: str  # what runs, in Spark SQL: `spark_sql` with `_offset` selected
    reads: tuple[str, ...] = ()

    def duckdb_sql(self, columns: pa.Schema) -> str:
        """The statement in DuckDB's dialect for rows of these columns; cached per worker, as a
        topic's chunks mostly share a few schemas (translating takes milliseconds)."""
        key = (self.statement, columns)
        sql = _translated.get(key)
        if sql is None:
            from sink_service.transform.dialect import duckdb_sql

            if len(_translated) >= _TRANSLATED_MAX:
                _translated.clear()
            sql = _translated[key] = duckdb_sql(self.statement, columns)
        return sql

    def apply(self, rows: pa.Table) -> pa.Table:
        """The statement's output over `rows`, in their order; raises `TransformFailed`."""
        import duckdb

        rows = _with_absent_columns(rows, self.reads)
        sql = self.duckdb_sql(rows.schema)
        con = _connection()
        con.register(TABLE, rows)
        try:
            out = con.sql(sql).to_arrow_table()
        except duckdb.OutOfMemoryException as exc:  # the environment's fault: never blamed on records
            raise MemoryError(f"SINK_TRANSFORM_SQL ran out of memory: {exc}") from exc
        except duckdb.Error as exc:  # conversion, out of range, invalid input, a type no function takes...
            raise TransformFailed(first_line(exc)) from exc
        finally:
            con.unregister(TABLE)
        return _checked(_with_input_types(out, rows))


def _with_absent_columns(rows: pa.Table, reads: tuple[str, ...]) -> pa.Table:
    """`rows` with a null column for each column read that none of them has (names match
    case-insensitively, as in Spark and DuckDB). The file writer leaves all-null columns out."""
    present = {name.lower() for name in rows.column_names}
    for name in reads:
        if name.lower() not in present:
            rows = rows.append_column(name, pa.nulls(rows.num_rows))
            present.add(name.lower())
    return rows


def _with_input_types(out: pa.Table, rows: pa.Table) -> pa.Table:
    """DuckDB hands timestamps back in microseconds and in its local time zone: a timestamp column
    that comes out under its input name keeps its input type (`_timestamp` stays milliseconds,
    UTC), and any other zoned timestamp is labelled UTC (the same instants), so types never
    depend on the host's time zone."""
    types = dict(zip(rows.column_names, rows.schema.types, strict=True))
    for i, field in enumerate(out.schema):
        if not pa.types.is_timestamp(field.type):
            continue
        before = types.get(field.name)
        target = before if before is not None and pa.types.is_timestamp(before) else (
            pa.timestamp(field.type.unit, tz="UTC") if field.type.tz else None)
        if target is not None and target != field.type:
            out = out.set_column(i, field.with_type(target), out.column(i).cast(target))
    return out


def _checked(out: pa.Table) -> pa.Table:
    """Files need unique column names and the Kafka offset, as a whole number, on every row."""
    names = out.column_names
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TransformFailed(f"its output has more than one column named {', '.join(twice)}")
    if OFFSET not in names or not pa.types.is_integer(out.schema.field(OFFSET).type):
        raise TransformFailed(f"its output lacks `{OFFSET}` as the Kafka offset")
    if out.column(OFFSET).null_count:
        raise TransformFailed(f"its output has a NULL `{OFFSET}`")
    offsets = out.column(OFFSET).combine_chunks()
    if len(offsets) > 1 and not pc.all(pc.greater(offsets[1:], offsets[:-1])).as_py():
        raise TransformFailed("its output is not one row per record in offset order")
    return out


def first_line(exc: BaseException) -> str:
    """Engine messages carry a caret drawing of the statement: the first line names the problem."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


_local = threading.local()
_translated: dict[tuple[str, pa.Schema], str] = {}
_TRANSLATED_MAX = 256


def _connection():
    """One in-memory DuckDB per worker thread, reused across chunks (a connection costs ~ms),
    single-threaded: Spark already runs one task per core. The statement reads only the chunk:
    no files, no network, no extensions fetched or loaded."""
    con = getattr(_local, "con", None)
    if con is None:
        import duckdb

        con = _local.con = duckdb.connect(":memory:", config={
            "threads": 1, "enable_external_access": False,
            "autoinstall_known_extensions": False, "autoload_known_extensions": False})
    return con
