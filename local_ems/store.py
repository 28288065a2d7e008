"""The SQLite store: one table per targetName, upserts by primary key, and the upload log.

One database file in WAL mode: a single writer connection behind a lock applies uploads one at a
time (SQLite allows one writer anyway), while readers open their own short-lived connections and
never block it. Each upload is one transaction: schema changes, rows and its log entry commit
together or not at all.

Upsert rule (EMS's duplicate removal): with primary keys, one row per key survives inside a file (the
highest order value). Across files the upsert mode decides: in `order` mode a row replaces the stored
row of its key only if its order column is higher, or the stored one is NULL; in `last-upload` mode
it always replaces it, as an endpoint that applies files in arrival order would. Without an order
column the later upload wins in both. Without primary keys every row is appended. Table and column
names follow SQLite and compare case-insensitively.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_ems.responses import HttpError

UPLOADS_TABLE = "_ems_uploads"
ORDER_MODE = "order"
LAST_UPLOAD_MODE = "last-upload"
UPSERT_MODES = (ORDER_MODE, LAST_UPLOAD_MODE)


@dataclass(frozen=True)
class PreparedRows:
    """What an upload writes: column names and declared types, and rows deduplicated per key."""

    target_name: str
    columns: tuple[str, ...]
    declared_types: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    primary_keys: tuple[str, ...] = ()
    order_column: str | None = None


@dataclass(frozen=True)
class UploadEntry:
    id: str
    pool: str
    target_name: str
    file_name: str
    params: dict[str, str]
    rows: int
    bytes: int
    received_at: float
    path: str

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "pool": self.pool, "targetName": self.target_name, "fileName": self.file_name,
                "params": self.params, "rows": self.rows, "bytes": self.bytes, "received_at": self.received_at,
                "path": self.path}


def check_upsert_mode(mode: str) -> str:
    if mode not in UPSERT_MODES:
        raise ValueError(f"upsert mode {mode!r} is not one of {', '.join(UPSERT_MODES)}")
    return mode


def quote(identifier: str) -> str:
    """SQL identifier quoting: any name, including quotes and spaces, becomes a literal identifier."""
    return '"' + identifier.replace('"', '""') + '"'


class UpsertStore:
    """Thread-safe; create one per data directory. `upsert_mode` is one of UPSERT_MODES."""

    def __init__(self, path: Path, upsert_mode: str = ORDER_MODE) -> None:
        self.path = Path(path)
        self.upsert_mode = check_upsert_mode(upsert_mode)
        self._lock = threading.Lock()
        self._writer = self._connect()
        self._writer.execute("PRAGMA journal_mode=WAL")
        # No fsync: WAL without it still survives the endpoint's own crash or kill, which is what tests
        # and benchmarks do to it; only the host's crash could lose recent uploads. With NORMAL, the
        # checkpoint that followed nearly every upload fsynced, and every commit held the writer lock
        # for it: 96 uploads of ~2,150 new keys took 110 ms each (46 ms without), and a system's
        # concurrent uploads queued behind them.
        self._writer.execute("PRAGMA synchronous=OFF")
        self._writer.execute("PRAGMA cache_size=-131072")  # 128 MiB: upserts stay in memory
        self._writer.execute(
            f"CREATE TABLE IF NOT EXISTS {UPLOADS_TABLE} (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT, "
            "pool TEXT, targetName TEXT, fileName TEXT, params TEXT, rows INTEGER, bytes INTEGER, "
            "received_at REAL, path TEXT)"
        )

    def close(self) -> None:
        with self._lock:
            self._writer.close()

    def apply(self, prepared: PreparedRows, entry: UploadEntry) -> None:
        """Create or widen the table, upsert or append the rows, and log the upload, atomically."""
        with self._lock:
            connection = self._writer
            connection.execute("BEGIN IMMEDIATE")
            try:
                table_columns, table_keys = self._ensure_table(connection, prepared)
                if prepared.rows:
                    sql = _insert_sql(prepared, table_columns, table_keys, self.upsert_mode)
                    connection.executemany(sql, prepared.rows)
                connection.execute(
                    f"INSERT INTO {UPLOADS_TABLE} (id, pool, targetName, fileName, params, rows, bytes, "
                    "received_at, path) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (entry.id, entry.pool, entry.target_name, entry.file_name, json.dumps(entry.params),
                     entry.rows, entry.bytes, entry.received_at, entry.path),
                )
                connection.execute("COMMIT")
            except BaseException as error:
                connection.execute("ROLLBACK")
                if isinstance(error, sqlite3.IntegrityError | OverflowError):
                    raise HttpError(400, f"table {prepared.target_name!r} rejected the rows: {error}") from error
                raise

    def table(self, target_name: str) -> tuple[list[str], list[tuple[Any, ...]]] | None:
        """(column names, rows) of a table, or None when no upload created it yet."""
        with closing(self._connect()) as connection:
            info = _table_info(connection, target_name)
            if not info:
                return None
            cursor = connection.execute(f"SELECT * FROM {quote(target_name)}")
            columns = [description[0] for description in cursor.description]
            rows = cursor.fetchall()
        booleans = [n for n, (_, declared, _) in enumerate(info) if declared.upper() == "BOOLEAN"]
        if booleans:
            rows = [_with_booleans(row, booleans) for row in rows]
        return columns, rows

    def count(self, target_name: str) -> int | None:
        with closing(self._connect()) as connection:
            if not _table_info(connection, target_name):
                return None
            return int(connection.execute(f"SELECT count(*) FROM {quote(target_name)}").fetchone()[0])

    def uploads(self, target_name: str | None = None) -> list[dict[str, Any]]:
        """Upload log entries in the order they were applied."""
        sql = (f"SELECT id, pool, targetName, fileName, params, rows, bytes, received_at, path "
               f"FROM {UPLOADS_TABLE}")
        arguments: tuple[str, ...] = ()
        if target_name is not None:
            sql, arguments = sql + " WHERE targetName = ?", (target_name,)
        with closing(self._connect()) as connection:
            rows = connection.execute(sql + " ORDER BY seq", arguments).fetchall()
        return [UploadEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), *r[5:]).as_dict() for r in rows]

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=60)

    def _ensure_table(self, connection: sqlite3.Connection,
                      prepared: PreparedRows) -> tuple[list[str], list[str]]:
        """The table's column names and primary key after adding what this upload needs."""
        name = prepared.target_name
        info = _table_info(connection, name)
        if not info:
            definitions = [f"{quote(c)} {t}".rstrip() for c, t in zip(prepared.columns, prepared.declared_types,
                                                                     strict=True)]
            if prepared.primary_keys:
                definitions.append(f"PRIMARY KEY ({', '.join(quote(k) for k in prepared.primary_keys)})")
            without_rowid = " WITHOUT ROWID" if prepared.primary_keys else ""
            connection.execute(f"CREATE TABLE {quote(name)} ({', '.join(definitions)}){without_rowid}")
            return list(prepared.columns), list(prepared.primary_keys)
        columns = [column for column, _, _ in info]
        keys = [column for column, _, position in sorted(info, key=lambda i: i[2]) if position]
        _check_keys(name, keys, prepared.primary_keys)
        known = {column.casefold() for column in columns}
        for column, declared in zip(prepared.columns, prepared.declared_types, strict=True):
            if column.casefold() not in known:
                connection.execute(f"ALTER TABLE {quote(name)} ADD COLUMN {quote(column)} {declared}".rstrip())
                columns.append(column)
                known.add(column.casefold())
        return columns, keys


def _table_info(connection: sqlite3.Connection, name: str) -> list[tuple[str, str, int]]:
    """(name, declared type, position in the primary key or 0) per column; empty if no such table."""
    rows = connection.execute("SELECT name, type, pk FROM pragma_table_info(?)", (name,)).fetchall()
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]


def _check_keys(name: str, table_keys: Sequence[str], request_keys: Sequence[str]) -> None:
    if {k.casefold() for k in table_keys} == {k.casefold() for k in request_keys}:
        return
    has = f"primary key ({', '.join(table_keys)})" if table_keys else "no primary key"
    asked = f"primaryKeys={','.join(request_keys)}" if request_keys else "no primaryKeys"
    raise HttpError(400, f"table {name!r} was created with {has}, but this request has {asked}; "
                         "send the same primary keys for every upload into a table")


def _insert_sql(prepared: PreparedRows, table_columns: Sequence[str], table_keys: Sequence[str],
                upsert_mode: str) -> str:
    table = quote(prepared.target_name)
    sql = (f"INSERT INTO {table} ({', '.join(quote(c) for c in prepared.columns)}) "
           f"VALUES ({', '.join('?' for _ in prepared.columns)})")
    if not table_keys:
        return sql
    conflict = f" ON CONFLICT ({', '.join(quote(k) for k in table_keys)})"
    key_set = {k.casefold() for k in table_keys}
    # Every non-key column is replaced, so a column missing from this file becomes NULL: the newer row
    # replaces the older one as a whole.
    updates = [c for c in table_columns if c.casefold() not in key_set]
    if not updates:
        return sql + conflict + " DO NOTHING"
    sql += conflict + " DO UPDATE SET " + ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in updates)
    if prepared.order_column is not None and upsert_mode == ORDER_MODE:
        order = next(c for c in table_columns if c.casefold() == prepared.order_column.casefold())
        sql += f" WHERE {table}.{quote(order)} IS NULL OR excluded.{quote(order)} > {table}.{quote(order)}"
    return sql


def _with_booleans(row: tuple[Any, ...], positions: Sequence[int]) -> tuple[Any, ...]:
    values = list(row)
    for n in positions:
        if values[n] in (0, 1):
            values[n] = bool(values[n])
    return tuple(values)
