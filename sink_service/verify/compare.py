"""Latest row per key on both sides, and a FULL OUTER JOIN of the two, in duckdb on disk.

Why duckdb: 10M keys do not fit a Python dict on a small container, and duckdb's window, join and
aggregate operators spill to its temporary directory under `memory_limit`. The database itself is a
file in the temporary directory, so the tables built here live on disk, not in memory.

A key is
- `equal`: the target holds the expected row (same order value, same content in every column both
  sides have), or the key's latest record is a soft delete (`_deleted`) and the target holds the
  deletion row or nothing;
- `missing`: the topic has it, the target does not;
- `stale`: the target's order value is lower than the topic's latest;
- `ahead`: the target's order value is higher: uploaded past the committed offsets (the service
  uploads, then commits) -- reported, but not a failure;
- `extra`: the target has a key the topic (up to the committed offsets) does not;
- `differing`: same order value, different content.
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

STATUSES = ("equal", "missing", "stale", "extra", "differing", "ahead")
FAILING = ("missing", "stale", "extra", "differing")
_T_FILE, _T_TOPIC, _T_PARTITION, _T_FIRST, _T_WHERE = "__t_file", "__t_topic", "__t_partition", "__t_first", "__t_where"
_ROW = "file_row_number"
_BOOKKEEPING = {TOPIC_COLUMN, PARTITION_COLUMN, _T_FILE, _T_TOPIC, _T_PARTITION, _T_FIRST, _T_WHERE, _ROW}


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
                order: str, examples: int) -> TableResult:
        result = TableResult(table)
        db = self.db
        for name in ("e", "t", "cmp"):
            db.execute(f"DROP TABLE IF EXISTS {name}")
        key_list = ", ".join(q(k) for k in keys)
        if expected:
            files = [str(p) for p in expected]
            db.execute(f"CREATE TABLE e AS SELECT * FROM read_parquet(?, union_by_name = true) QUALIFY row_number() "
                       f"OVER (PARTITION BY {key_list} ORDER BY {q(order)} DESC NULLS LAST, {q(TOPIC_COLUMN)} DESC, "
                       f"{q(PARTITION_COLUMN)} DESC, _offset DESC) = 1", [files])
        else:  # nothing committed: an empty table with the key and order columns
            db.execute(f"CREATE TABLE e AS SELECT {', '.join(f'NULL::VARCHAR AS {q(c)}' for c in (*keys, order))}, "
                       f"NULL::VARCHAR AS {q(TOPIC_COLUMN)}, NULL::INTEGER AS {q(PARTITION_COLUMN)}, "
                       "NULL::BIGINT AS _offset LIMIT 0")
        e_types = self._types("e")
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
            projection = ", ".join(_cast(c, t_types[c], e_types.get(c)) for c in t_types)
            db.execute(f"CREATE TABLE t AS SELECT {projection} FROM {t_all} QUALIFY row_number() OVER (PARTITION BY "
                       f"{key_list} ORDER BY {q(order)} DESC NULLS LAST, {_T_FIRST} DESC, {_ROW} DESC) = 1")
            db.unregister("origins")
        else:
            db.execute("CREATE TABLE t AS SELECT * FROM e LIMIT 0")
        t_types = self._types("t")
        content = [c for c in e_types if c in t_types and c not in _BOOKKEEPING and c not in keys]
        lacking = [c for c in e_types if c not in t_types and c not in _BOOKKEEPING and c != "_offset"]
        if lacking and target:
            result.notes.append(f"the target has no column {', '.join(lacking)}; not compared")
        deleted = f"e.{q(DELETED)}" if DELETED in e_types and e_types[DELETED] == "BOOLEAN" else "false"
        same = " AND ".join(f"e.{q(c)} IS NOT DISTINCT FROM t.{q(c)}" for c in content) or "true"
        join = " AND ".join(f"e.{q(k)} = t.{q(k)}" for k in keys)
        extra_origin = [f"t.{q(c)} AS {q('target' + c)}" for c in ("_topic", "_partition", "_offset") if c in t_types]
        t_where = f"t.{_T_WHERE}" if _T_WHERE in t_types else "NULL::VARCHAR"
        db.execute(f"""
            CREATE TABLE cmp AS SELECT
              CASE WHEN t.__present IS NULL THEN CASE WHEN coalesce({deleted}, false) THEN 'equal' ELSE 'missing' END
                   WHEN e.__present IS NULL THEN 'extra'
                   WHEN t.{q(order)} < e.{q(order)} THEN 'stale'
                   WHEN t.{q(order)} > e.{q(order)} THEN 'ahead'
                   WHEN {same} THEN 'equal'
                   ELSE 'differing' END AS status,
              coalesce({deleted}, false) AS deleted,
              {', '.join(f'coalesce(e.{q(k)}, t.{q(k)}) AS {q(k)}' for k in keys)},
              e.{q(order)}::VARCHAR AS expected_order, t.{q(order)}::VARCHAR AS target_order,
              e.{q(TOPIC_COLUMN)} AS topic, e.{q(PARTITION_COLUMN)} AS partition, e._offset AS "offset",
              {t_where} AS target_file {''.join(', ' + x for x in extra_origin)}
            FROM (SELECT *, true AS __present FROM e) e FULL OUTER JOIN (SELECT *, true AS __present FROM t) t
            ON {join}""")
        for status, count in db.execute("SELECT status, count(*) FROM cmp GROUP BY status").fetchall():
            result.counts[status] = count
        result.deleted_keys = db.execute("SELECT count(*) FROM cmp WHERE deleted").fetchone()[0]
        for status in STATUSES:
            if status == "equal" or not result.counts[status]:
                continue
            cursor = db.execute(f"SELECT * EXCLUDE (status, deleted) FROM cmp WHERE status = ? ORDER BY topic, "
                                f"partition, \"offset\", target_file LIMIT {int(examples)}", [status])
            names = [d[0] for d in cursor.description]
            result.examples[status] = [_example(dict(zip(names, row, strict=True)), keys) for row in cursor.fetchall()]
        return result

    def _types(self, relation: str) -> dict[str, str]:
        return {row[0]: row[1] for row in self.db.execute(f"DESCRIBE {relation}").fetchall()}


def _strings(values: Iterable[str]) -> str:
    """A SQL list of string literals (a view's definition cannot take parameters)."""
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def _cast(column: str, have: str, want: str | None) -> str:
    """A target column in the topic side's type, so values compare (local_ems stores timestamps as text)."""
    if want is None or want == have:
        return q(column)
    if have == "VARCHAR" and (want.startswith(("STRUCT", "MAP")) or want.endswith("[]")):
        return f"TRY_CAST(TRY_CAST({q(column)} AS JSON) AS {want}) AS {q(column)}"
    return f"TRY_CAST({q(column)} AS {want}) AS {q(column)}"


def _example(row: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    example: dict[str, Any] = {"key": {k: _plain(row.pop(k)) for k in keys}}
    example.update({k: _plain(v) for k, v in row.items() if v is not None})
    return example


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, str | int | float | bool) else json.loads(
        json.dumps(value, default=str))
