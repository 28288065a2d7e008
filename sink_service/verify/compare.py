"""Latest row per key on both sides, and a FULL OUTER JOIN of the two, in duckdb on disk.

Why duckdb: 10M keys do not fit a Python dict on a small container, and duckdb's window, join and
aggregate operators spill to its temporary directory under `memory_limit`. The database itself is a
file in the temporary directory, so the tables built here live on disk, not in memory.

Three tables: `e`, the latest row per key of the topic up to the committed offsets; `t`, the target's
latest row per key (its columns cast to the topic side's types, order included, so "10" > "9"); `b`,
the records past the committed offsets, one per key and order value. A key is
- `equal`: the target holds the expected row (same order value, same content), or the key's latest
  record is a soft delete (`_deleted`) and the target holds the deletion row or nothing;
- `missing`: the topic has it, the target does not;
- `stale`: the target's order value is lower than the topic's latest;
- `ahead`: the target holds a record past the committed offsets, content and all (the service
  uploads, then commits), or no longer holds a key a record past them deletes (a Delta table's hard
  deletes) -- reported, but not a failure;
- `invented`: the target's order value is higher than the topic's latest and no record past the
  commits has it: a row the topic never held;
- `extra`: the target has a key the topic does not (not even past the commits);
- `differing`: the record with the target's order value (up to or past the commits) holds other
  content.
Content is every column of the topic's row: one the target lacks must be null there, a target value
that does not cast to the topic's type differs, and the target's columns the topic lacks are not
compared.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from sink_service.decode.tombstones import DELETED
from sink_service.verify.expected import PARTITION_COLUMN, TOPIC_COLUMN
from sink_service.verify.target import TargetFile

STATUSES = ("equal", "missing", "stale", "extra", "differing", "invented", "ahead")
FAILING = ("missing", "stale", "extra", "differing", "invented")
_T_FILE, _T_TOPIC, _T_PARTITION, _T_FIRST, _T_WHERE = "__t_file", "__t_topic", "__t_partition", "__t_first", "__t_where"
_UNCAST = "__t_uncast"  # per target row: the columns whose value does not cast to the topic's type, and the value
_ROW = "file_row_number"
_BOOKKEEPING = {TOPIC_COLUMN, PARTITION_COLUMN, _T_FILE, _T_TOPIC, _T_PARTITION, _T_FIRST, _T_WHERE, _ROW, _UNCAST}
_UNSTORED = "_offset"  # the spill files always hold it; a target may not (SINK_METADATA_COLUMNS)


@dataclass
class TableResult:
    table: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    deleted_keys: int = 0  # keys whose latest record is a soft delete

    @property
    def keys_checked(self) -> int:
        return sum(self.counts.values())

    @property
    def equal(self) -> bool:
        return not any(self.counts[s] for s in FAILING)


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Comparer:
    """One duckdb database in `work_dir`, bounded by `memory_limit` and spilling there."""

    def __init__(self, work_dir: Path, memory_limit: str = "1GB", threads: int = 2) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        self.db = duckdb.connect(str(work_dir / "verify.duckdb"))
        spill = work_dir / "duckdb-spill"
        for statement in (f"SET memory_limit = '{memory_limit}'", f"SET temp_directory = '{spill}'",
                          f"SET threads = {int(threads)}", "SET preserve_insertion_order = false",
                          "SET TimeZone = 'UTC'", "SET enable_progress_bar = false"):
            self.db.execute(statement)

    def close(self) -> None:
        self.db.close()

    def compare(self, table: str, expected: Sequence[Path], target: Sequence[TargetFile], keys: Sequence[str],
                order: str, examples: int, beyond: Sequence[Path] = ()) -> TableResult:
        """`beyond`: spill files of the records past the committed offsets, for the target's `ahead` rows."""
        result = TableResult(table)
        db = self.db
        for name in ("e", "t", "b", "bd", "cmp", "ex"):
            db.execute(f"DROP TABLE IF EXISTS {name}")
        key_list = ", ".join(q(k) for k in keys)
        e_files, b_files = [str(p) for p in expected], [str(p) for p in beyond]
        # One type per column on both topic sides (records past the commits may be wider), else e's own.
        unified = self._types(f"SELECT * FROM read_parquet({_strings(e_files + b_files)}, union_by_name = true)") \
            if b_files else {}
        if e_files:
            db.execute(f"CREATE TABLE e AS SELECT {self._projection(e_files, unified)} FROM read_parquet(?, "
                       f"union_by_name = true) QUALIFY row_number() OVER (PARTITION BY {key_list} ORDER BY "
                       f"{q(order)} DESC NULLS LAST, {q(TOPIC_COLUMN)} DESC, {q(PARTITION_COLUMN)} DESC, "
                       "_offset DESC) = 1", [e_files])
        else:  # nothing committed: an empty table with the key and order columns
            columns = {**dict.fromkeys((*keys, order, TOPIC_COLUMN), "VARCHAR"), PARTITION_COLUMN: "INTEGER",
                       "_offset": "BIGINT"}
            db.execute("CREATE TABLE e AS SELECT " + ", ".join(
                f"NULL::{unified.get(c, kind)} AS {q(c)}" for c, kind in columns.items()) + " LIMIT 0")
        if b_files:
            db.execute(f"CREATE TABLE b AS SELECT {self._projection(b_files, unified)} FROM read_parquet(?, "
                       f"union_by_name = true) QUALIFY row_number() OVER (PARTITION BY {key_list}, {q(order)} "
                       f"ORDER BY {q(TOPIC_COLUMN)} DESC, {q(PARTITION_COLUMN)} DESC, _offset DESC) = 1", [b_files])
        e_types = self._types("e")
        b_types = self._types("b") if b_files else {}
        deletes_past = b_types.get(DELETED) == "BOOLEAN"
        if deletes_past:  # keys whose latest record past the commits deletes them: a target may have let them go
            db.execute(f"CREATE TABLE bd AS SELECT {key_list}, {q(order)}, {q(TOPIC_COLUMN)}, {q(PARTITION_COLUMN)}, "
                       f"_offset FROM (SELECT * FROM b QUALIFY row_number() OVER (PARTITION BY {key_list} ORDER BY "
                       f"{q(order)} DESC NULLS LAST, {q(TOPIC_COLUMN)} DESC, {q(PARTITION_COLUMN)} DESC, _offset "
                       f"DESC) = 1) WHERE {q(DELETED)}")
        want = unified or e_types
        if target:
            origins = pa.table({
                _T_FILE: [str(f.path) for f in target], _T_TOPIC: [f.topic for f in target],
                _T_PARTITION: pa.array([f.partition for f in target], pa.int32()),
                _T_FIRST: pa.array([f.first_offset for f in target], pa.int64()), _T_WHERE: [f.where for f in target]})
            db.register("origins", origins)
            t_all = (f"(SELECT r.*, o.* EXCLUDE ({_T_FILE}) FROM read_parquet({_strings(str(f.path) for f in target)}, "
                     f"union_by_name = true, filename = '{_T_FILE}', file_row_number = true) r JOIN origins o "
                     f"USING ({_T_FILE}))")
            t_types = self._types(f"SELECT * FROM {t_all}")
            missing_keys = [k for k in (*keys, order) if k not in t_types]
            if missing_keys:
                result.notes.append(f"the target has no column {', '.join(missing_keys)}: every key counts as missing")
                target = []
        if target:
            casts = {c: _cast(c, t_types[c], want.get(c)) for c in t_types}
            projection = ", ".join(f"{expression} AS {q(c)}" for c, expression in casts.items())
            uncast = [f"CASE WHEN {q(c)} IS NOT NULL AND {casts[c]} IS NULL THEN {{'column': {_string(c)}, "
                      f"'value': left({q(c)}::VARCHAR, 200)}} END" for c in t_types if casts[c] != q(c)]
            if uncast:
                projection += f", nullif(list_filter([{', '.join(uncast)}], lambda x: x IS NOT NULL), []) AS {_UNCAST}"
            # An order value that does not cast wins, so the key shows as differing rather than hide it.
            first = f"({q(order)} IS NOT NULL AND {casts[order]} IS NULL) DESC, " if casts[order] != q(order) else ""
            db.execute(f"CREATE TABLE t AS SELECT {projection} FROM (SELECT * FROM {t_all} QUALIFY row_number() OVER "
                       f"(PARTITION BY {key_list} ORDER BY {first}{casts[order]} DESC NULLS LAST, {_T_FIRST} DESC, "
                       f"{_ROW} DESC) = 1)")
            db.unregister("origins")
        else:
            db.execute("CREATE TABLE t AS SELECT * FROM e LIMIT 0")
        t_types = self._types("t")
        e_content, b_content = _content(e_types, keys), _content(b_types, keys)
        lacking = [c for c in e_content if c not in t_types and c != _UNSTORED]
        if lacking and target:
            held = db.execute("SELECT " + ", ".join(f"count({q(c)})" for c in lacking) + " FROM e").fetchone()
            result.notes += [f"the target has no column {c}: {n:,} of the topic's latest rows hold a value there"
                             if n else f"the target has no column {c}; the topic's latest rows hold no value there"
                             for c, n in zip(lacking, held, strict=True)]
        deleted = f"e.{q(DELETED)}" if DELETED in e_types and e_types[DELETED] == "BOOLEAN" else "false"
        same_e, same_b = _same("e", e_content, t_types), _same("b", b_content, t_types)
        on_t = " AND ".join(f"e.{q(k)} = t.{q(k)}" for k in keys)
        extra_origin = [f"t.{q(c)} AS {q('target' + c)}" for c in ("_topic", "_partition", "_offset") if c in t_types]
        t_where = f"t.{_T_WHERE}" if _T_WHERE in t_types else "NULL::VARCHAR"
        origin = (TOPIC_COLUMN, PARTITION_COLUMN, "_offset")
        if b_files:
            b_join = ("LEFT JOIN (SELECT *, true AS __present FROM b) b ON "
                      + " AND ".join(f"b.{q(k)} = t.{q(k)}" for k in (*keys, order)))
            b_present, b_origin = "b.__present", [f"b.{q(c)}" for c in origin]
        else:
            b_join, b_present, b_origin = "", "NULL::BOOLEAN", ["NULL::VARCHAR", "NULL::INTEGER", "NULL::BIGINT"]
        if deletes_past:
            bd_join = ("LEFT JOIN bd ON " + " AND ".join(f"bd.{q(k)} = e.{q(k)}" for k in keys))
            gone, d_origin = f"coalesce(bd.{q(order)} > e.{q(order)}, false)", [f"bd.{q(c)}" for c in origin]
        else:
            bd_join, gone, d_origin = "", "false", ["NULL::VARCHAR", "NULL::INTEGER", "NULL::BIGINT"]
        e_origin = [f"e.{q(c)}" for c in origin]
        origins = ", ".join(f"{expression} AS __{side}{n}" for side, expressions in (
            ("e", e_origin), ("b", b_origin), ("d", d_origin)) for n, expression in enumerate(expressions))
        by_b = f"CASE WHEN {b_present} IS NULL THEN '{{none}}' WHEN {same_b} THEN 'ahead' ELSE 'differing' END"
        # The record compared is one past the commits: an `ahead` row, or one differing from such a record;
        # or (`__gone`) the deletion past the commits of a key the target no longer holds.
        past = "coalesce(__b AND (status = 'ahead' OR status = 'differing' AND __by_b), false)"
        db.execute(f"""
            CREATE TABLE cmp AS SELECT * EXCLUDE (__b, __by_b, __gone, __e0, __e1, __e2, __b0, __b1, __b2, __d0, __d1,
                                                  __d2),
              nullif(__gone OR {past}, false) AS past_commit,
              {', '.join(f"CASE WHEN __gone THEN __d{n} WHEN {past} THEN __b{n} ELSE __e{n} END AS {name}"
                         for n, name in enumerate(('topic', 'partition', '"offset"')))}
            FROM (SELECT
              CASE WHEN t.__present IS NULL THEN CASE WHEN coalesce({deleted}, false) THEN 'equal'
                                                      WHEN {gone} THEN 'ahead' ELSE 'missing' END
                   WHEN e.__present IS NULL THEN {by_b.replace('{none}', 'extra')}
                   WHEN t.{q(order)} < e.{q(order)} THEN 'stale'
                   WHEN t.{q(order)} > e.{q(order)} THEN {by_b.replace('{none}', 'invented')}
                   WHEN {same_e} THEN 'equal'
                   WHEN coalesce({b_present} AND {same_b}, false) THEN 'ahead'
                   ELSE 'differing' END AS status,
              {b_present} IS NOT NULL AS __b, e.__present IS NULL OR t.{q(order)} > e.{q(order)} AS __by_b,
              t.__present IS NULL AND {gone} AS __gone,
              coalesce({deleted}, false) AS deleted,
              {', '.join(f'coalesce(e.{q(k)}, t.{q(k)}) AS {q(k)}' for k in keys)},
              e.{q(order)}::VARCHAR AS expected_order, t.{q(order)}::VARCHAR AS target_order, {origins},
              {t_where} AS target_file {''.join(', ' + x for x in extra_origin)}
            FROM (SELECT *, true AS __present FROM e) e FULL OUTER JOIN (SELECT *, true AS __present FROM t) t
            ON {on_t} {b_join} {bd_join})""")
        for status, count in db.execute("SELECT status, count(*) FROM cmp GROUP BY status").fetchall():
            result.counts[status] = count
        result.deleted_keys = db.execute("SELECT count(*) FROM cmp WHERE deleted").fetchone()[0]
        for status in STATUSES:
            if status == "equal" or not result.counts[status]:
                continue
            result.examples[status] = self._examples(status, examples, keys, order, e_content, b_content, t_types,
                                                     want)
        return result

    def _examples(self, status: str, limit: int, keys: Sequence[str], order: str, e_content: Sequence[str],
                  b_content: Sequence[str], t_types: dict[str, str], want: dict[str, str]) -> list[dict[str, Any]]:
        """The first `limit` keys of `status` by origin; a differing one says which columns differ and how."""
        db = self.db
        ordering = f"topic, partition, \"offset\", target_file, {', '.join(q(k) for k in keys)}"
        db.execute(f"CREATE OR REPLACE TEMP TABLE ex AS SELECT row_number() OVER (ORDER BY {ordering}) AS __n, * "
                   f"EXCLUDE (status, deleted) FROM (SELECT * FROM cmp WHERE status = ? ORDER BY {ordering} "
                   f"LIMIT {int(limit)})", [status])
        cursor = db.execute("SELECT * EXCLUDE (__n) FROM ex ORDER BY __n")
        names = [d[0] for d in cursor.description]
        found = [_example(dict(zip(names, row, strict=True)), keys) for row in cursor.fetchall()]
        if status != "differing":
            return found
        for side, content, past in (("e", e_content, False), ("b", b_content, True)):
            if not content:
                continue
            on_b = f" AND b.{q(order)} = t.{q(order)}" if side == "b" else ""
            columns = [(c, f"{side}.{q(c)}", f"t.{q(c)}" if c in t_types else None) for c in content
                       if c in t_types or c != _UNSTORED]
            select = ", ".join(f"{_same_column(x, y)}, {x}, {y or 'NULL'}" for _c, x, y in columns)
            uncast = f"t.{_UNCAST}" if _UNCAST in t_types else "NULL"
            rows = db.execute(
                f"SELECT ex.__n, {uncast}, {select} FROM ex JOIN t ON "
                + " AND ".join(f"t.{q(k)} = ex.{q(k)}" for k in keys) + f" JOIN {side} ON "
                + " AND ".join(f"{side}.{q(k)} = ex.{q(k)}" for k in keys)
                + f"{on_b} WHERE coalesce(ex.past_commit, false) = {str(past).lower()}").fetchall()
            for n, bad_casts, *values in rows:
                not_cast = {item["column"]: item["value"] for item in bad_casts or ()}
                differences: dict[str, Any] = {}
                for i, (c, _x, y) in enumerate(columns):
                    same, expected_value, target_value = values[3 * i: 3 * i + 3]
                    if c in not_cast:
                        differences[c] = {"expected": _plain(expected_value), "target": not_cast[c],
                                          "target_does_not_cast_to": want[c]}
                    elif not same:
                        differences[c] = ({"expected": _plain(expected_value), "target_lacks_column": True}
                                          if y is None else
                                          {"expected": _plain(expected_value), "target": _plain(target_value)})
                found[n - 1]["differences"] = differences
        return found

    def _projection(self, files: Sequence[str], types: dict[str, str]) -> str:
        """The files' own columns, each in `types`' type (the type both topic sides share), else as is."""
        if not types:
            return "*"
        own = self._types(f"SELECT * FROM read_parquet({_strings(files)}, union_by_name = true)")
        return ", ".join(q(c) if kind == types[c] else f"CAST({q(c)} AS {types[c]}) AS {q(c)}"
                         for c, kind in own.items())

    def _types(self, relation: str) -> dict[str, str]:
        return {row[0]: row[1] for row in self.db.execute(f"DESCRIBE {relation}").fetchall()}


def _content(types: dict[str, str], keys: Sequence[str]) -> list[str]:
    return [c for c in types if c not in _BOOKKEEPING and c not in keys]


def _same_column(topic_side: str, target_side: str | None) -> str:
    """The target holds the topic's value: the same, or null where the target lacks the column."""
    return f"{topic_side} IS NULL" if target_side is None else f"{topic_side} IS NOT DISTINCT FROM {target_side}"


def _same(side: str, content: Sequence[str], t_types: dict[str, str]) -> str:
    """Row `side` and row `t` hold the same content (SQL)."""
    checks = [_same_column(f"{side}.{q(c)}", f"t.{q(c)}" if c in t_types else None)
              for c in content if c in t_types or c != _UNSTORED]
    if _UNCAST in t_types:
        checks.append(f"t.{_UNCAST} IS NULL")
    return " AND ".join(checks) or "true"


def _string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _strings(values: Iterable[str]) -> str:
    """A SQL list of string literals (a view's definition cannot take parameters)."""
    return "[" + ", ".join(_string(v) for v in values) + "]"


def _cast(column: str, have: str, want: str | None) -> str:
    """A target column in the topic side's type, so values compare (local_ems stores timestamps as text,
    an order column may be text): SQL, the column itself when no cast is needed."""
    if want is None or want == have or want == '"NULL"':  # a topic column that is null throughout has no type
        return q(column)
    if have == "VARCHAR" and (want.startswith(("STRUCT", "MAP")) or want.endswith("[]")):
        return f"TRY_CAST(TRY_CAST({q(column)} AS JSON) AS {want})"
    return f"TRY_CAST({q(column)} AS {want})"


def _example(row: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    example: dict[str, Any] = {"key": {k: _plain(row.pop(k)) for k in keys}}
    example.update({k: _plain(v) for k, v in row.items() if v is not None})
    return example


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, str | int | float | bool) else json.loads(
        json.dumps(value, default=str))
