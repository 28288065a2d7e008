"""SINK_TRANSFORM_SQL: a Spark SQL `SELECT … FROM records` checked at startup and transpiled to DuckDB.

sqlglot parses the statement as Spark SQL with Spark 4's ANSI `CAST` (a value that does not
convert is an error, not NULL) and writes it as DuckDB SQL (`duckdb_sql`), which `transform.py`
runs in tasks. Every problem is found at startup, before a record is read, and reported at once:
- constructs that are not row-wise (joins, aggregates, windows, subqueries, row generators,
  ORDER BY/LIMIT/DISTINCT, set operations...): a task sees one offset range in chunks, so any
  of them would give answers that depend on how records happen to be batched, and files,
  offsets and commits rely on each output row being one record with its own `_offset`;
- a statement that drops the order column or a primary key, or computes `_offset`;
- what DuckDB itself rejects (unknown columns and functions, types no function takes), found by
  running the statement over an empty table of the columns the decoded rows will have.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import pyarrow as pa
import sqlglot
from sqlglot import exp

from sink_service.transform.dialect import SparkAnsi, _source_name
from sink_service.transform.rows import OFFSET, TABLE, Transform, TransformFailed, first_line

ENV = "SINK_TRANSFORM_SQL"
log = logging.getLogger(__name__)

# Constructs that combine, multiply, order or sample rows, or read other tables: not row-wise.
_REJECTED: tuple[tuple[type[exp.Expression], str], ...] = (
    (exp.Join, "a join"),
    (exp.Lateral, "LATERAL VIEW"),
    (exp.Explode, "explode/posexplode (one row per element)"),
    (exp.Inline, "inline (one row per element)"),
    (exp.Stack, "stack (several rows per record)"),
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
    (exp.Pivot, "PIVOT/UNPIVOT"),
)


class TransformInvalid(ValueError):
    """Every problem found in the statement, each naming SINK_TRANSFORM_SQL."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


def compile_transform(sql: str, *, order_field: str, primary_keys: Iterable[str], columns: pa.Schema,
                      complete: bool, reserved: Iterable[str] = (), flat: bool = False) -> Transform:
    """The statement checked and transpiled to DuckDB; `TransformInvalid` lists every problem.

    `columns`: the columns the decoded rows are known to have (a declared schema's, the metadata
    columns written). `complete`: whether those are all (a declared schema); if not, any other
    column the statement reads is taken to be a field that may arrive (checked as all-NULL), except
    the `reserved` names (metadata columns that are not written), which never will. `flat`: rows
    are flattened (SINK_FLATTEN), so they hold no struct whose fields could be read.
    """
    problems, statement = _parsed(sql)
    if statement is None:
        raise TransformInvalid(problems)
    problems += _row_wise_problems(statement) + _offset_problems(statement)
    if flat:
        problems += [f"{ENV} reads `{'.'.join(path)}`, but SINK_FLATTEN makes rows flat: the field is the column "
                     f"`{'_'.join(path)}`." for path in _struct_fields(statement)]
    if problems:
        raise TransformInvalid(problems)
    if not _keeps(statement, OFFSET):  # files are named, bounded and committed by it
        statement = statement.select(exp.column(OFFSET, table=_source_name(statement)), copy=True)
    transform = Transform(sql, statement.sql(dialect=SparkAnsi), _reads(statement))
    unwritten = sorted(set(transform.reads) & set(reserved) - set(columns.names))
    if unwritten:
        raise TransformInvalid([f"{ENV} reads {', '.join(f'`{n}`' for n in unwritten)}, which SINK_METADATA_COLUMNS "
                                "does not write; add it there."])
    # With a declared schema every column is known: a name outside it is a mistake, not a NULL.
    # Without one, the keys may be fields of the records that a `*` carries through.
    keys = (order_field, *primary_keys)
    defined = {e.alias for e in statement.expressions if isinstance(e, exp.Alias)}
    expected = tuple(name for name in keys if name not in defined and name not in transform.reads)
    checked = dataclasses.replace(transform, reads=() if complete else transform.reads + expected)
    sample = pa.Table.from_pylist([], schema=columns)
    try:
        output = checked.apply(sample)
    except TransformFailed as exc:
        raise TransformInvalid([f"{ENV} does not run: {exc.engine}"]) from None
    problems = _kept_column_problems(output, order_field, keys[1:])
    if problems:
        raise TransformInvalid(problems)
    return transform


def _parsed(sql: str) -> tuple[list[str], exp.Select | None]:
    try:
        statements = [s for s in sqlglot.parse(sql, read=SparkAnsi) if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        return [f"{ENV} is not valid Spark SQL: {first_line(exc)}"], None
    if len(statements) == 1 and isinstance(statements[0], exp.SetOperation):
        return [_not_row_wise("UNION/INTERSECT/EXCEPT")], None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        return [f"{ENV} must be one `SELECT … FROM {TABLE}` statement."], None
    return [], statements[0]


def _row_wise_problems(statement: exp.Select) -> list[str]:
    problems = [_not_row_wise(name) for kind, name in _REJECTED if statement.find(kind) is not None]
    if any(select is not statement for select in statement.find_all(exp.Select)):
        problems.append(f"{ENV} has a subquery; only row-wise statements over `{TABLE}` are allowed.")
    tables = {t.name for t in statement.find_all(exp.Table)}
    source = statement.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or tables != {TABLE}:
        problems.append(f"{ENV} must read only from `{TABLE}` (the decoded rows), found "
                        f"{', '.join(sorted(tables)) or 'no table'}.")
    return problems


def _not_row_wise(construct: str) -> str:
    return (f"{ENV} uses {construct}; only row-wise statements are allowed (each output row from one record "
            f"of `{TABLE}`).")


def _offset_problems(statement: exp.Select) -> list[str]:
    """`_offset` names files and bounds commits: it may come out only as itself."""
    for e in statement.expressions:
        if e.alias_or_name == OFFSET and not isinstance(e, exp.Column):
            return [f"{ENV} computes `{OFFSET}`: it is the Kafka offset that names files and bounds commits, "
                    "so it may only be selected as it is."]
        if isinstance(e, exp.Alias) and isinstance(e.this, exp.Column) and e.this.name == OFFSET \
                and e.alias != OFFSET:
            return [f"{ENV} renames `{OFFSET}` to `{e.alias}`; select `{OFFSET}` as it is (copy it under "
                    "another name if you need one)."]
    return []


def _kept_column_problems(output: pa.Table, order_field: str, primary_keys: tuple[str, ...]) -> list[str]:
    """The order column and every primary key must come out of the statement, by name."""
    names = set(output.column_names)
    return [f"{ENV} drops `{name}` ({env}); select it (e.g. `SELECT *, …` or `SELECT {name}, …`): every row "
            "needs it." for env, name in [("SINK_ORDER_FIELD", order_field)] +
            [("SINK_PRIMARY_KEYS", key) for key in primary_keys] if name not in names]


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


def _struct_fields(statement: exp.Select) -> list[list[str]]:
    """`customer.name` (not `records.name`): a struct's field, as the parts of its path."""
    source = _source_name(statement)
    paths = [[p.name for p in column.parts] for column in statement.find_all(exp.Column)]
    return [path for path in paths if len(path) > 1 and path[0] not in (source, TABLE)]


def _reads(statement: exp.Select) -> tuple[str, ...]:
    """The top-level columns the statement reads: `r.id` is `id`, `s.a.b` (struct fields) is `s`.
    A name an earlier select item defines is that item's value there (a lateral alias), not a read."""
    source = _source_name(statement)
    reads: dict[str, None] = {}

    def add(node: exp.Expression, lateral: set[str]) -> None:
        for column in node.find_all(exp.Column):
            parts = [p.name for p in column.parts]
            if len(parts) > 1 and parts[0] in (source, TABLE):
                parts = parts[1:]
            elif len(parts) == 1 and parts[0] in lateral:
                continue
            if parts and parts[0]:
                reads.setdefault(parts[0])

    defined: set[str] = set()
    for item in statement.expressions:
        add(item, defined)
        if isinstance(item, exp.Alias):
            defined.add(item.alias)
    for key, node in statement.args.items():
        if key != "expressions" and isinstance(node, exp.Expression):
            add(node, set())
    return tuple(reads)
