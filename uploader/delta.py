"""Delta Lake target: closed files merged into a Delta table (delta-rs, no JVM), exactly once.

`merge` applies several files of one table in one commit; the service's driver calls it once per
micro-batch and table with the files its tasks staged (sink_service.driver.delta_batches); `upload` is a
merge of one file (`python -m uploader push`).

Upsert semantics are EMS's (`duplicateRemovalOrderColumn`), applied here:
- the files' rows are first reduced to the latest row per primary key (highest order value; without an
  order column the last row, files in the order given), because a merge needs unique source keys; a tie
  on the order column between two files keeps the earlier file's row, as applying them one by one would;
- `MERGE ... ON t.k = s.k`: a source row replaces the table's row only when the table's order value
  is NULL or lower, so an older file applied late (or a replay) never moves a key back;
- rows carry `_deleted` under `SINK_TOMBSTONES=soft-delete` and are stored like any row (soft delete);
  with `SINK_DELTA_HARD_DELETES=true` a newer `_deleted` row deletes the key's row instead, and a
  deleted key not in the table is not inserted;
- without primary keys the rows are appended, as EMS appends them.

Exactly once. Each partition's progress rides in the same Delta commit as its rows: an application
transaction `(app_id, version)` with app_id `kafka-parquet-sink/<group>/<topic>/<partition>` and
version `last offset + 1` of its last file in the commit. Before merging, the target reads
`DeltaTable.transaction_version(app_id)` from the newest snapshot: a file the table already covers is
skipped (a replay after a crash, or the table ahead of Kafka's committed offsets), and a file that
overlaps the covered range is applied only from the covered end on (by its `_offset` column). Commits
are made with `max_commit_retries=0`: delta-rs writes the next log entry put-if-absent (local file
systems and S3's conditional writes), so any commit that lands between our read and our commit fails
ours, and the retry re-reads the table and checks the transactions again. A conflict is never resolved
by delta-rs behind our back, which is what makes "never applied twice" hold for two writers on one
partition too (a zombie after a rebalance). A conflict is a RetryableUploadError with reason
`delta_conflict` (counted per reason like every retry).

Schema evolution follows the decode lattice (uploader.column_types). A file column narrower
than the table's is converted up by us where every value stays exact (an int into a double column). A
file column wider than the table's (a double for a long column) widens the table: one overwrite commit
rewrites the table's rows with the column converted by the lattice (once for all files of a merge), then
the merge proceeds; a conflict with another writer is the retried `delta_conflict`, and application
transactions are log state the rewrite keeps. Widening into text (a string for a long column) needs
SINK_DELTA_WIDEN_TO_STRING=true: one dirty value would otherwise turn a numeric column into text for good.
What cannot widen (that, a partition column, nested or temporal types a safe cast refuses) is a
DeltaRefusal (reason `delta_schema`) naming topic, partition, offsets and column and carrying the file: a
content rejection, parked under SINK_REJECTED_FILE_POLICY=park like an EMS 400. Nothing reaches
delta-rs's own cast, which truncates (9.5 into an int column is 9). New columns are added
(`merge_schema`; two files with one new column in two types are unified by the lattice); a column the
table holds but a file lacks is NULL in rows that file inserts or replaces.

Maintenance (compaction, log cleanup, vacuum) runs after a commit on a version multiple: delta_maintenance.
"""

from __future__ import annotations

import decimal
import json
import logging
import math
import pathlib
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, SchemaMismatchError, TableNotFoundError

from uploader.classify import certificate_error
from uploader.column_types import convert, join, unify
from uploader.delta_maintenance import maintain
from uploader.delta_settings import (
    HARD_DELETES_SETTING,
    POLICY_SETTING,
    TABLE_URI_SETTING,
    WIDEN_TO_STRING_SETTING,
    DeltaSettings,
)
from uploader.delta_storage import certificate_failure, error_text, storage_options
from uploader.errors import FatalUploadError, RetryableUploadError, UploadError
from uploader.parquet_info import bookkeeping_columns
from uploader.retry import OnRetry, call_with_retries
from uploader.s3_settings import CREDENTIALS_SETTING, ENDPOINT_URL_SETTING
from uploader.target import FileMetadata, Receipt

log = logging.getLogger(__name__)

DELETED = "_deleted"
OFFSET = "_offset"
NARROWING = "delta_schema"
CONFLICT = "delta_conflict"
# Every snapshot update and every transaction_version() replays the log entries since the last checkpoint (delta-rs
# 1.6, one GET each on S3: ~100 per look at the default interval of 100 commits, measured on moto's S3). A
# checkpoint every 10 commits (written by delta-rs's post-commit hook; Parquet of the table's actions, small for our
# file counts) keeps each look at <= 10 entries. Tables created before keep their own interval.
TABLE_PROPERTIES = {"delta.checkpointInterval": "10"}
WIDEN_ATTEMPTS = 5  # a widening that loses this many commit races in a row stops the service, saying why
# Written into each commit's info (DeltaTable.history()), so applications per file can be counted: a JSON
# list of the files the commit applied, each {file, app_id, first_offset, last_offset, applied_from}
# (`applied_from`: the first offset the commit applied; later than first_offset when an overlap was cut).
META_FILES = "kafka_parquet_sink.files"
# A rewrite that widened columns ("name: old -> new, ...") and the file that needed it; not META_FILE:
# the rewrite applies no rows of the file (its merge is the next commit), so it is no application.
META_WIDENED = "kafka_parquet_sink.widened"
META_WIDENED_FOR = "kafka_parquet_sink.widened_for"
_ROW = "__delta_target_row__"
_SOURCE_BATCH_ROWS = 65_536
_FILE = "__delta_target_file__"  # the place of a row's file in a merge: ties on the order column go to the earlier
_FATAL_STORE_WORDS = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                      "InvalidToken", "403 Forbidden", "status: 403", "Forbidden")
_MISSING_BUCKET_WORDS = ("NoSuchBucket",)


@dataclass(frozen=True)
class DeltaFile:
    """A closed file to apply: its bytes on a local disk, and the offsets and keys it holds."""

    path: pathlib.Path
    metadata: FileMetadata


@dataclass(frozen=True)
class BadValue:
    """A record with a value its table's column cannot take (text in a number column): left out of the merge
    and handed to the caller's policy (the service's SINK_ERROR_POLICY), so one dirty value costs its record."""

    topic: str
    partition: int
    offset: int
    column: str
    value: str
    wanted: str  # the table's type of the column

    def describe(self) -> str:
        return (f"topic={self.topic} partition={self.partition} offset={self.offset}: column {self.column!r} holds "
                f"{self.value[:100]!r}, which the Delta table's {self.wanted} column cannot take")


BadValues = Callable[[list[BadValue]], None]


@dataclass(frozen=True)
class _Piece:
    """What one attempt applies of a file: its rows from the table's covered end on."""

    metadata: FileMetadata
    rows: pa.Table
    app_id: str
    applied_from: int
    bookkeeping: tuple[str, ...] = ()  # columns of `rows` the table never gets (parquet_info.BOOKKEEPING_KEY)

    def describe(self) -> dict[str, Any]:
        m = self.metadata
        return {"file": m.file_name(), "app_id": self.app_id, "first_offset": m.first_offset,
                "last_offset": m.last_offset, "applied_from": self.applied_from}


def applied_files(commit_info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The files a commit of this target applied, from its commit info (`DeltaTable.history()` or the
    `commitInfo` action of a log entry); empty for any other commit."""
    text = commit_info.get(META_FILES)
    return json.loads(text) if text else []


class DeltaTarget:
    """UploadTarget merging files into Delta tables; one per Python worker, reused across tasks."""

    name = "delta"

    def __init__(self, settings: DeltaSettings) -> None:
        self.settings = settings
        self._tables: dict[str, tuple[DeltaTable, tuple[Any, ...]]] = {}
        self._widenings_lost: dict[str, int] = {}  # per table: widening rewrites lost in a row
        self._lock = threading.Lock()

    # --- the interface --------------------------------------------------------------------------

    def upload(self, path: pathlib.Path, metadata: FileMetadata, on_retry: OnRetry | None = None) -> Receipt:
        """Apply one file by hand (`python -m uploader push`: a parked file, or a range an operator repairs).

        Unlike the service's merges it is applied whatever the table's progress, since that progress has
        usually passed a parked file, and it records none: each row still replaces a key's row only when
        its order value is higher, so a row older than the table's is ignored (counted in `rows_not_applied`,
        with deletions of keys the table lacks). Retried on conflicts and I/O errors."""
        path = pathlib.Path(path)
        size = path.stat().st_size
        started = time.monotonic()
        details, attempts = self.merge([DeltaFile(path, metadata)], on_retry, by_hand=True)
        return Receipt(
            target=self.name,
            location=f"{self.settings.uri_for(metadata.topic)}@v{details['version']}",
            response_id=str(details["version"]),
            bytes=size,
            attempts=attempts,
            duration_s=time.monotonic() - started,
            details=details,
        )

    def merge(self, files: Sequence[DeltaFile], on_retry: OnRetry | None = None,
              by_hand: bool = False, on_bad_values: BadValues | None = None) -> tuple[dict[str, Any], int]:
        """Apply files of one table in one commit: the latest row per key across all of them, and every
        partition's progress as its application transaction. A partition's files must come in offset order.
        `by_hand`: apply every row whatever the table's progress, and record none (see `upload`).
        `on_bad_values`: called before the commit with the records whose value a column cannot take (text in a
        number column the table may not widen), which the merge leaves out; it may raise to stop the merge.
        Without it such a file is refused whole.

        Returns the commit's details and the attempts it took. A refusal (FatalUploadError, reason
        `delta_schema`) carries the files it concerns as `error.files`: one when a file does not fit the
        table; all of them when delta-rs refused the merge, which the caller can split to find the file."""
        uris = {self.uri_for(f.metadata.topic) for f in files}
        if len(uris) != 1:
            raise ValueError(f"one merge applies files of one table, not of {sorted(uris)}")
        uri = uris.pop()
        with self._lock:  # one merge at a time per target: a second would only conflict with the first
            details, attempts = call_with_retries(
                lambda attempt: self._apply(files, uri, by_hand, on_bad_values), self.settings.retry, on_retry)
            cached = self._tables.get(uri)
            if details.get("committed_version") and cached is not None:  # after our commit; never raises
                maintenance = maintain(cached[0], self._maintenance_settings(), details["committed_version"])
                if maintenance:
                    details = {**details, "maintenance": maintenance}
        return details, attempts

    def covered_to(self, topic: str, partition: int) -> int | None:
        """The first offset of the partition the table does not hold (its application transaction), or
        None when the table or the partition's transaction does not exist yet."""
        uri = self.uri_for(topic)
        app_id = self.settings.app_id(topic, partition)
        with self._lock:
            try:
                table = self._open(uri)
                held = table.transaction_version(app_id) if table else None
                return _later(held, self._progress_elsewhere(topic, app_id))
            except Exception:
                self._forget(uri)
                raise

    def uri_for(self, topic: str) -> str:
        """The Delta table this target writes a topic's files into."""
        return self.settings.uri_for(topic)

    def _maintenance_settings(self) -> DeltaSettings:
        """What maintenance runs after this target's commits (delta_maintenance)."""
        return self.settings

    def _commit_info(self, pieces: Sequence[_Piece]) -> dict[str, str]:
        """More of the commit's info (DeltaTable.history()) than the files it applied."""
        return {}

    def _progress_elsewhere(self, topic: str, app_id: str) -> int | None:
        """A partition's progress held by another table that counts as this one's (the change log's keyed table)."""
        return None

    def describe_request(self, path: pathlib.Path, metadata: FileMetadata) -> dict[str, Any]:
        """What upload() would do; for a --dry-run that touches no table."""
        return {
            "method": "Delta MERGE (latest row per key, order column rule) with an application transaction",
            "table_uri": self.settings.uri_for(metadata.topic),
            "app_id": self.settings.app_id(metadata.topic, metadata.partition),
            "transaction_version": metadata.last_offset + 1,
            "primary_keys": list(metadata.primary_keys),
            "order_column": metadata.order_column,
            "hard_deletes": self.settings.hard_deletes,
            "file_path": str(path),
            "file_size": pathlib.Path(path).stat().st_size,
        }

    def close(self) -> None:
        self._tables.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- one attempt ----------------------------------------------------------------------------

    def _apply(self, files: Sequence[DeltaFile], uri: str, by_hand: bool = False,
               on_bad_values: BadValues | None = None) -> dict[str, Any]:
        what = f"Delta merge of {_describe(files)} into {uri}"
        pieces: list[_Piece] = []
        try:
            table = self._open(uri)
            skipped: list[str] = []
            ends: dict[str, int] = {}  # app_id -> the first offset the table will not hold
            seen: dict[str, int | None] = {}  # app_id -> the table's progress these decisions were made on
            elsewhere: dict[str, int | None] = {}
            for file in files:
                metadata = file.metadata
                app_id = self.settings.app_id(metadata.topic, metadata.partition)
                if app_id not in seen:
                    seen[app_id] = table.transaction_version(app_id) if table is not None and not by_hand else None
                    if not by_hand:
                        elsewhere[app_id] = self._progress_elsewhere(metadata.topic, app_id)
                # An earlier file of this merge, else the table's progress.
                done = ends.get(app_id, _later(seen[app_id], elsewhere.get(app_id)))
                if done is not None and done > metadata.last_offset:
                    log.info("%s: %s skipped: the table already holds %s up to offset %d", what,
                             metadata.file_name(), app_id, done - 1)
                    skipped.append(metadata.file_name())
                    continue
                rows = pq.read_table(file.path)
                _require_key_columns(rows, metadata, uri)
                applied_from = metadata.first_offset
                if done is not None and done > metadata.first_offset:
                    if OFFSET not in rows.column_names:  # only a file written by hand lacks it
                        raise _refusal(metadata, uri, f"the table holds offsets up to {done - 1} of this file's range, "
                                                      f"and it has no {OFFSET} column to apply only the rest by")
                    rows = rows.filter(pc.greater_equal(rows[OFFSET], pa.scalar(done, rows.schema.field(OFFSET).type)))
                    applied_from = done
                pieces.append(_Piece(metadata, _storable(rows), app_id, applied_from, bookkeeping_columns(rows.schema)))
                if not by_hand:
                    ends[app_id] = metadata.last_offset + 1
            if not pieces:
                return {"version": table.version(), "skipped": True, "skipped_files": skipped, "applied": []}
            if table is None:
                table = self._create(uri, self._new_table_schema(
                    pieces[0].rows.drop_columns(list(pieces[0].bookkeeping)).schema, pieces[0].metadata.topic))
            rows, bad = self._fitted(pieces, table, uri, files[0].path.parent, on_bad_values is not None)
            if bad and on_bad_values is not None:
                on_bad_values(bad)
            # Creating or widening the table loaded its newest snapshot: a rival's commit read there (a zombie's
            # merge of these ranges) would not fail ours, which only conflicts with commits after it.
            if not by_hand:
                _require_same_progress(table, seen, uri)
            applied = [{**piece.describe(), **({"by_hand": True} if by_hand else {})} for piece in pieces]
            commit = CommitProperties(
                app_transactions=[Transaction(app_id, end) for app_id, end in ends.items()],
                max_commit_retries=0,
                custom_metadata={META_FILES: json.dumps(applied), **self._commit_info(pieces)},
            )
            read_version = table.version()
            keys, order = pieces[0].metadata.primary_keys, pieces[0].metadata.order_column
            counts = self._write(table, rows, keys, order, commit)
            rows = rows.drop_columns([_FILE])
            if table.version() == read_version and ends:
                # A merge that changes no row (every row older than the table's) commits nothing, not even
                # its application transactions: the ranges are recorded by a commit of their own without
                # rows, so the table's progress never lags what it has taken in and a replay is skipped.
                write_deltalake(table, rows.slice(0, 0), mode="append", schema_mode="merge", commit_properties=commit)
            committed = table.version()  # no retries: read version + 1
            table.update_incremental()
        except UploadError:
            self._forget(uri)
            raise
        except Exception as exc:  # deltalake raises its own errors and plain OSError/ValueError from Rust
            self._forget(uri)
            raise classify_error(exc, what=what, files=[p.metadata for p in pieces] or
                                 [f.metadata for f in files]) from exc
        log.debug("%s applied as version %d: %s", what, committed, counts)
        changed = sum(counts.get(k, 0) for k in ("num_target_rows_inserted", "num_target_rows_updated",
                                                  "num_target_rows_deleted"))
        not_applied = max(0, counts.get("num_source_rows", rows.num_rows) - changed)
        return {"version": committed, "committed_version": committed if committed != read_version else None,
                "skipped": False, "skipped_files": skipped, "applied": applied,
                "covered_to": ends, "rows": rows.num_rows, "rows_not_applied": not_applied, "bad_values": len(bad),
                **{k: v for k, v in counts.items() if k.startswith("num_")}}

    def _fitted(self, pieces: list[_Piece], table: DeltaTable, uri: str, scratch: pathlib.Path,
                tolerate: bool) -> tuple[pa.Table, list[BadValue]]:
        """The pieces' rows in one Arrow table of the table's types, the table widened first where a
        file holds wider values; each row tagged with its file's place in the merge (`_FILE`). With
        `tolerate`, the records holding a value a column cannot take are left out and returned."""
        fitted = [self._fit(p, table, uri, tolerate) for p in pieces]
        widen: dict[str, pa.DataType] = {}
        for _, wider, _ in fitted:
            for name, type_ in wider.items():
                widen[name] = join(widen[name], type_) if name in widen else type_
        if widen:  # the files hold wider values than the table: the table's columns widen first, once
            needing = next(p.metadata for p, (_, w, _) in zip(pieces, fitted, strict=True) if w)
            table = self._widen(table, widen, needing, uri, scratch)
            fitted = [self._fit(p, table, uri, tolerate) for p in pieces]
            if any(wider for _, wider, _ in fitted):
                raise RetryableUploadError(f"Delta merge into {uri}: the table's schema changed meanwhile",
                                           reason=CONFLICT)
        tagged = [rows.append_column(_FILE, pa.repeat(pa.scalar(n, pa.int32()), rows.num_rows))
                  for n, (rows, _, _) in enumerate(fitted)]
        rows = tagged[0] if len(tagged) == 1 else pa.concat_tables(unify(tagged))
        return _with_every_column(rows, pa.schema(table.schema().to_arrow())), [b for _, _, bad in fitted for b in bad]

    def _write(self, table: DeltaTable, rows: pa.Table, keys: Sequence[str], order: str | None,
               commit: CommitProperties, pin: str | None = None) -> dict[str, Any]:
        """Commit the rows (tagged `_FILE`): merged on the keys, appended without keys. `pin`: a predicate on the
        table's partition columns the merge is confined to, so it rewrites only those files."""
        if keys:
            return self._merge(table, rows, keys, order, commit, pin)
        write_deltalake(table, _in_small_batches(rows.drop_columns([_FILE])), mode="append", schema_mode="merge",
                        commit_properties=commit)
        return {"num_target_rows_inserted": rows.num_rows}

    def _merge(self, table: DeltaTable, rows: pa.Table, keys: Sequence[str], order: str | None,
               commit: CommitProperties, pin: str | None = None) -> dict[str, Any]:
        rows = _in_small_batches(latest_per_key(rows, keys, order, file_column=_FILE).drop_columns([_FILE]))
        on = " AND ".join([*([pin] if pin else []), *(f"t.{_q(k)} = s.{_q(k)}" for k in keys)])
        newer = f"(t.{_q(order)} IS NULL OR s.{_q(order)} > t.{_q(order)})" if order else None
        merger = table.merge(rows, predicate=on, source_alias="s", target_alias="t", merge_schema=True,
                             commit_properties=commit)
        if self.settings.hard_deletes and DELETED in rows.column_names:
            deleted = f"s.{_q(DELETED)} = true"
            kept = f"(s.{_q(DELETED)} IS NULL OR s.{_q(DELETED)} = false)"
            merger = merger.when_matched_delete(predicate=f"{deleted} AND {newer}" if newer else deleted)
            merger = merger.when_matched_update_all(predicate=newer)
            merger = merger.when_not_matched_insert_all(predicate=kept)
        else:
            merger = merger.when_matched_update_all(predicate=newer).when_not_matched_insert_all()
        return merger.execute()

    # --- tables ---------------------------------------------------------------------------------

    def _open(self, uri: str) -> DeltaTable | None:
        """The newest snapshot of the table, or None when there is none yet."""
        options = storage_options(self.settings)
        cached = self._tables.get(uri)
        if cached is not None and cached[1] == tuple(sorted(options.items())):
            cached[0].update_incremental()
            return cached[0]
        try:
            table = DeltaTable(uri, storage_options=options or None)
        except TableNotFoundError:
            return None
        self._tables[uri] = (table, tuple(sorted(options.items())))
        return table

    def _new_table_schema(self, rows: pa.Schema, topic: str) -> pa.Schema:
        """The schema a table this target creates gets, from the first rows it writes."""
        return rows

    def _partition_by(self) -> tuple[str, ...]:
        return self.settings.table_partition_by()

    def _create(self, uri: str, schema: pa.Schema) -> DeltaTable:
        """Created from the first file's schema; `ignore`: another writer may create it at the same time."""
        options = storage_options(self.settings)
        partition_by = list(self._partition_by())
        missing = [c for c in partition_by if c not in schema.names]
        if missing:
            raise FatalUploadError(
                f"cannot create the Delta table {uri}: partition column(s) {', '.join(missing)} are not among "
                f"the file's columns ({', '.join(schema.names)}). Check SINK_DELTA_PARTITION_BY.",
                reason="delta_partition_by", setting="SINK_DELTA_PARTITION_BY")
        DeltaTable.create(uri, schema, mode="ignore", partition_by=partition_by or None,
                          storage_options=options or None, configuration=TABLE_PROPERTIES)
        log.info("created the Delta table %s (partitioned by %s)", uri, partition_by or "nothing")
        table = DeltaTable(uri, storage_options=options or None)
        self._tables[uri] = (table, tuple(sorted(options.items())))
        return table

    def _forget(self, uri: str) -> None:
        self._tables.pop(uri, None)

    def _fit(self, piece: _Piece, table: DeltaTable, uri: str,
             tolerate: bool) -> tuple[pa.Table, dict[str, pa.DataType], list[BadValue]]:
        """The file's columns converted to the table's types where no value changes (the decode lattice's
        `convert`: int into a double column, a number into a string column, a struct into a struct with
        more fields), and the columns the table must widen to hold the file (the lattice's join: a double
        into an int column, a struct with a field the table's lacks); a refusal otherwise.

        delta-rs's own cast would truncate (9.5 into an int column is stored as 9), and its own nested
        schema evolution in a merge nulls the grown struct of every row the merge copies: nothing reaches
        it in a type the table does not hold.

        With `tolerate`, text in a number or bool column the table may not widen keeps the values that are
        exactly a number (the lattice wrote the file's numbers as text beside a dirty one) and leaves out the
        records whose value is not, returned as BadValues; the bookkeeping columns are dropped last."""
        rows, metadata = piece.rows, piece.metadata
        table_schema = pa.schema(table.schema().to_arrow())
        partitions = set(table.metadata().partition_columns)
        columns, widen = [], {}
        dirty: pa.Array | None = None  # rows holding a value some column cannot take
        bad: list[tuple[str, pa.ChunkedArray, pa.Array, str]] = []
        for name in rows.column_names:
            column = rows[name]
            if name not in table_schema.names or name in piece.bookkeeping:
                columns.append(column)
                continue
            wanted = table_schema.field(name).type
            if column.type.equals(wanted) or _same_kind(column.type, wanted):
                columns.append(column)
                continue
            if _nested(column.type) or _nested(wanted):
                fitted = convert(column.combine_chunks(), wanted)
            elif _kind(column.type) is None or _kind(wanted) is None:  # temporal, binary: a safe cast
                try:
                    columns.append(pc.cast(column, wanted, safe=True))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise _refusal(metadata, uri, f"column {name!r} ({column.type}) does not fit the table's "
                                                  f"{wanted}: {exc}") from exc
                continue
            else:
                fitted = _lossless(column, wanted, convert)
            if _equivalent(fitted.type, wanted):
                columns.append(fitted if fitted.type.equals(wanted) or not _nested(wanted) else fitted.cast(wanted))
                continue
            problem = self._cannot_widen(name, column.type, wanted, fitted.type, partitions)
            if problem and tolerate and OFFSET in rows.column_names and _kind(column.type) == 3 \
                    and _kind(wanted) in (0, 1, 2):
                parsed, unfit = _exact_values(column, wanted)
                columns.append(parsed)
                bad.append((name, column, unfit, str(wanted)))
                dirty = unfit if dirty is None else pc.or_(dirty, unfit)
                continue
            if problem:
                raise _refusal(metadata, uri, problem)
            widen[name] = fitted.type
            columns.append(fitted)
        fitted_rows = pa.table(columns, names=rows.column_names)
        values: list[BadValue] = []
        if dirty is not None:
            offsets = rows[OFFSET].combine_chunks()
            for name, column, unfit, wanted in bad:
                for row in pc.indices_nonzero(unfit).to_pylist():
                    values.append(BadValue(metadata.topic, metadata.partition, offsets[row].as_py(), name,
                                           str(column[row].as_py()), wanted))
            fitted_rows = fitted_rows.filter(pc.invert(dirty))
        return fitted_rows.drop_columns(list(piece.bookkeeping)), widen, values

    def _cannot_widen(self, name: str, have: pa.DataType, wanted: pa.DataType, wider: pa.DataType,
                      partitions: set[str]) -> str | None:
        """Why the table's column may not become `wider`; None when it may."""
        what = f"column {name!r} is {have} in the file but {wanted} in the table"
        if name in partitions:
            return f"{what}, and it is a partition column, which the service does not rewrite"
        if _kind(wider) == 3 and not self.settings.widen_to_string:
            return (f"{what}; holding it would turn the table's column into text ({wider}), which "
                    f"{WIDEN_TO_STRING_SETTING}=true allows (the table is rewritten once, its values kept as text)")
        if _kind(wider) is None and not _nested(wider):
            return f"{what}, and the table cannot take {wider} without rewriting it"
        return None

    def _widen(self, table: DeltaTable, widen: dict[str, pa.DataType], metadata: FileMetadata,
               uri: str, scratch: pathlib.Path) -> DeltaTable:
        """Rewrite the table once with the columns widened, every old value converted by the lattice.

        One overwrite commit from the snapshot just read, `max_commit_retries=0`: a commit of anyone else
        in between fails it (a retried `delta_conflict` that re-reads the table, which another writer may
        have widened already). Application transactions are log state, untouched by the rewrite."""
        for _ in range(3):  # an old value may need a wider type than the file (2**53 + 1 beside a double)
            old = pa.schema(table.schema().to_arrow())
            new = pa.schema([f.with_type(widen[f.name]) if f.name in widen else f for f in old])
            changes = ", ".join(f"{n}: {old.field(n).type} -> {t}" for n, t in widen.items())
            # The old rows are converted into a scratch file first: delta-rs cannot read the table from
            # inside its own write (one async runtime), and a file keeps memory flat for a large table.
            with tempfile.TemporaryDirectory(dir=scratch, prefix=".delta-widen-") as tmp:
                converted = pathlib.Path(tmp) / "rows.parquet"
                needs: dict[str, pa.DataType] = {}
                with pq.ParquetWriter(converted, new) as writer:
                    for batch in table.to_pyarrow_dataset().to_batches():
                        arrays = [convert(batch.column(f.name), f.type) for f in new]
                        needs = {f.name: a.type for f, a in zip(new, arrays, strict=True)
                                 if not _equivalent(a.type, f.type)}
                        if needs:
                            break
                        arrays = [a if a.type.equals(f.type) else a.cast(f.type)  # string flavours only
                                  for f, a in zip(new, arrays, strict=True)]
                        writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=new))
                if needs:
                    partitions = set(table.metadata().partition_columns)
                    for n, t in needs.items():
                        problem = self._cannot_widen(n, old.field(n).type, old.field(n).type, t, partitions)
                        if problem:
                            raise _refusal(metadata, uri, f"the table's own values need more: {problem}")
                    widen = {**widen, **{n: join(widen.get(n, old.field(n).type), t) for n, t in needs.items()}}
                    continue
                # Written as delta-rs's merges write text (string_view in the files' Arrow schema), so that
                # readers concatenating the files with pyarrow see one type per column.
                viewed = pa.schema([f.with_type(pa.string_view()) if _kind(f.type) == 3 else f for f in new])
                batches = (b.cast(viewed) for b in pq.ParquetFile(converted).iter_batches())
                started = time.monotonic()
                try:
                    write_deltalake(
                        table, pa.RecordBatchReader.from_batches(viewed, batches), mode="overwrite",
                        schema_mode="overwrite", partition_by=list(table.metadata().partition_columns) or None,
                        commit_properties=CommitProperties(max_commit_retries=0, custom_metadata={
                            META_WIDENED: changes, META_WIDENED_FOR: metadata.file_name()}))
                except CommitFailedError as exc:
                    raise self._lost_widening(uri, changes, time.monotonic() - started) from exc
            self._widenings_lost.pop(uri, None)
            log.warning("widened the Delta table %s (%s) for %s: rewritten in one commit, version %d",
                        uri, changes, metadata.file_name(), table.version())
            table.update_incremental()
            return table
        raise _refusal(metadata, uri, f"the table's columns {', '.join(widen)} could not be widened")

    def _lost_widening(self, uri: str, changes: str, took_s: float) -> UploadError:
        """A rewrite cannot merge with a concurrent commit (it replaces every file), so under a writer that
        commits more often than the rewrite takes it would lose forever: retried a few times, then fatal."""
        lost = self._widenings_lost[uri] = self._widenings_lost.get(uri, 0) + 1
        if lost < WIDEN_ATTEMPTS:
            return RetryableUploadError(f"widening the Delta table {uri} ({changes}) lost a race with another "
                                        f"writer's commit ({lost} of {WIDEN_ATTEMPTS} tries)", reason=CONFLICT)
        self._widenings_lost.pop(uri, None)
        return FatalUploadError(
            f"widening the Delta table {uri} ({changes}) lost {lost} races in a row with other writers' commits: "
            f"its rewrite of the whole table (the last took {took_s:.1f}s) never lands while another writer "
            "commits more often. Stop the table's other writers (the other instances of this group, other groups) "
            "until this instance has widened it, then start them again; or write to a new table "
            f"({TABLE_URI_SETTING}).", reason="delta_widen_contended", setting=TABLE_URI_SETTING)


# --- rows -----------------------------------------------------------------------------------------

def latest_per_key(rows: pa.Table, keys: Sequence[str], order: str | None, file_column: str | None = None) -> pa.Table:
    """One row per key: the highest order value (nulls lose, ties keep the later row); without an
    order column the last row of the key, as if the rows were applied one by one.

    With `file_column` (the rows of several files, in order) the result is what applying the files one
    after the other gives: a tie on the order column between files keeps the earlier file's row, since a
    later file replaces a row only with a higher value.

    The ranking sorts only the key, order and file columns; the rows are copied once, by the final `take`
    (the driver's merge memory is a multiple of the rows it holds)."""
    if rows.num_rows <= 1:
        return rows
    ranking = [*keys, *([order] if order else []), *([file_column] if order and file_column else [])]
    ranked = rows.select(list(dict.fromkeys(ranking))).append_column(_ROW, pa.array(range(rows.num_rows), pa.int64()))
    sort = [(k, "ascending") for k in keys] + ([(order, "descending")] if order else [])
    if order and file_column:
        sort.append((file_column, "ascending"))
    sort.append((_ROW, "descending"))
    ranked = ranked.take(pc.sort_indices(ranked, sort_keys=sort))
    first: pa.Array | None = None
    for key in keys:
        column = ranked[key].combine_chunks()
        changed = pc.fill_null(pc.not_equal(column.slice(1), column.slice(0, len(column) - 1)), True)
        first = changed if first is None else pc.or_(first, changed)
    assert first is not None
    if pc.all(first).as_py():  # every key once (a batch of new keys): nothing to drop, nothing to copy
        return rows
    chosen = ranked[_ROW].filter(pa.concat_arrays([pa.array([True]), first]))
    return rows.take(chosen)


def _in_small_batches(rows: pa.Table) -> pa.Table:
    """The same rows in batches of at most 64k (zero-copy slices): delta-rs's merge holds about 3x a source
    of one large batch, 1.2x the same source in small ones (bench.delta_merge_memory)."""
    return pa.Table.from_batches(rows.to_batches(max_chunksize=_SOURCE_BATCH_ROWS), rows.schema)


def _with_every_column(rows: pa.Table, table_schema: pa.Schema) -> pa.Table:
    """A column of the table that no file of the merge has is null in its rows: a record that lacks a field
    (or holds null in it, which a file leaves out) clears it. delta-rs's update of all columns would keep
    the table's old value of a column the source lacks (a soft delete keeping the deleted row's values)."""
    for field in table_schema:
        if field.name not in rows.column_names:
            rows = rows.append_column(field, pa.nulls(rows.num_rows, field.type))
    return rows


def _storable(rows: pa.Table) -> pa.Table:
    """Delta has no null type: an all-null column of a file is stored as a nullable string."""
    for n, f in enumerate(rows.schema):
        if pa.types.is_null(f.type):
            rows = rows.set_column(n, f.name, pa.nulls(rows.num_rows, pa.string()))
    return rows


def _kind(t: pa.DataType) -> int | None:
    """The decode lattice's order (bool < int < double < string); None for types outside it."""
    if pa.types.is_boolean(t):
        return 0
    if pa.types.is_integer(t):
        return 1
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return 2
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return 3
    return None


def _nested(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def _equivalent(a: pa.DataType, b: pa.DataType) -> bool:
    """The same type up to the flavour of strings (string, large or view), at any depth."""
    if a.equals(b) or (_kind(a) == 3 and _kind(b) == 3):
        return True
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(
            _equivalent(x.type, y.type) for x, y in zip(a, b, strict=True))
    if _nested(a) and _nested(b) and not pa.types.is_struct(a) and not pa.types.is_struct(b):
        return _equivalent(a.value_type, b.value_type)
    return False


def _same_kind(have: pa.DataType, wanted: pa.DataType) -> bool:
    """Both strings (string/large/view) or both the same timestamp family: delta-rs converts losslessly."""
    return _kind(have) == 3 and _kind(wanted) == 3


def _exact_values(column: pa.ChunkedArray, wanted: pa.DataType) -> tuple[pa.Array, pa.Array]:
    """`column`'s text as `wanted` where a value is exactly one of its values ("12" for a long, "9.5" or
    "1e+16" for a double, "true" for a bool), null elsewhere; and the mask of non-null values that are not."""
    texts = column.combine_chunks().to_pylist()
    known: dict[str, Any] = {}
    for text in set(texts) - {None}:
        known[text] = _exact_value(text, wanted)
    values = [None if t is None else known[t] for t in texts]
    unfit = [t is not None and known[t] is None for t in texts]
    return pa.array(values, wanted), pa.array(unfit, pa.bool_())


def _exact_value(text: str, wanted: pa.DataType) -> Any:
    """The value of `wanted` that `text` writes exactly, or None."""
    try:
        if pa.types.is_boolean(wanted):
            return {"true": True, "false": False}.get(text)
        if pa.types.is_integer(wanted):
            return pa.scalar(int(text), wanted).as_py() if re.fullmatch(r"-?\d+", text) else None
        number = decimal.Decimal(text)
        if pa.types.is_decimal(wanted):
            return pa.scalar(number, wanted).as_py()
        value = float(text)
        return value if math.isfinite(value) and decimal.Decimal(value) == number else None
    except (ValueError, ArithmeticError, pa.ArrowInvalid, OverflowError):
        return None


def _lossless(column: pa.ChunkedArray, wanted: pa.DataType, convert: Any) -> pa.Array:
    """`column` in `wanted` when every value fits exactly (an int64 file into an int32 column whose values
    fit, an int into a double column), else in the lattice's join of both, which the table must widen to."""
    array = column.combine_chunks()
    if pa.types.is_integer(array.type) and pa.types.is_integer(wanted):
        try:
            return array.cast(wanted, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    return convert(array, wanted)



def _later(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else max(a, b)


def _require_key_columns(rows: pa.Table, metadata: FileMetadata, uri: str) -> None:
    keys, order = metadata.primary_keys, metadata.order_column
    for column in (*keys, *([order] if keys and order else [])):
        if column not in rows.column_names:
            raise _refusal(metadata, uri, f"column {column!r} (a primary key or the order column) is missing "
                                          "from the file")


def _require_same_progress(table: DeltaTable, seen: Mapping[str, int | None], uri: str) -> None:
    moved = {app_id for app_id, version in seen.items() if table.transaction_version(app_id) != version}
    if moved:
        raise RetryableUploadError(f"Delta merge into {uri}: another writer applied ranges of "
                                   f"{', '.join(sorted(moved))} meanwhile; re-checking what the table holds",
                                   reason=CONFLICT)


def _describe(files: Sequence[DeltaFile]) -> str:
    if len(files) == 1:
        return files[0].metadata.file_name()
    return f"{len(files)} files ({files[0].metadata.file_name()} ... {files[-1].metadata.file_name()})"


def _q(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


# --- errors ---------------------------------------------------------------------------------------

class DeltaRefusal(FatalUploadError):
    """The table cannot take these files' content (reason `delta_schema`): parked or fatal by policy.

    `files` are the files concerned: the one that does not fit, or every file of a merge delta-rs refused
    as a whole (the caller applies them one by one to find it)."""

    def __init__(self, files: Sequence[FileMetadata], uri: str, problem: str) -> None:
        first = files[0]
        what = (f"{first.file_name()} (topic {first.topic}, partition {first.partition}, offsets "
                f"{first.first_offset}-{first.last_offset})" if len(files) == 1
                else f"a merge of {len(files)} files ({', '.join(f.file_name() for f in files)})")
        super().__init__(
            f"Delta table {uri} refused {what}: {problem}. This will not be retried. {POLICY_SETTING}=park sets "
            f"the file aside under SINK_PARKED_PATH, commits its offsets and continues; `fail` (the default) "
            f"stops the service. To keep the column, write to a new table ({TABLE_URI_SETTING}) or change the "
            "producer.", reason=NARROWING, setting=POLICY_SETTING)
        self.body = problem
        self.files = list(files)


def _refusal(metadata: FileMetadata, uri: str, problem: str) -> DeltaRefusal:
    return DeltaRefusal([metadata], uri, problem)


def classify_error(exc: BaseException, *, what: str, files: Sequence[FileMetadata]) -> UploadError:
    """Conflicts and store trouble retry; a schema the table cannot take and bad credentials need a person."""
    detail = f"{type(exc).__name__}: {error_text(exc)}"[:500]
    text = str(exc)
    if isinstance(exc, CommitFailedError):
        return RetryableUploadError(f"{what}: another writer committed first; re-checking and retrying ({detail})",
                                    reason=CONFLICT)
    if certificate_failure(exc):  # an OSError from delta-rs, which is otherwise retried as I/O trouble
        return certificate_error(what, detail, ENDPOINT_URL_SETTING)
    if isinstance(exc, SchemaMismatchError) or "Cast error" in text or "Schema error" in text:
        return DeltaRefusal(files, what.rsplit(" into ", 1)[-1], detail)
    if any(word in text for word in _FATAL_STORE_WORDS):
        return FatalUploadError(
            f"{what}: the store refused our credentials; this will not be retried. Check {CREDENTIALS_SETTING} "
            f"and that they may read and write the table's location. ({detail})",
            reason="delta_access", setting=CREDENTIALS_SETTING)
    if any(word in text for word in _MISSING_BUCKET_WORDS):
        return FatalUploadError(
            f"{what}: the bucket does not exist; this will not be retried. Check {TABLE_URI_SETTING} and "
            f"{ENDPOINT_URL_SETTING}. ({detail})", reason="delta_no_bucket", setting=TABLE_URI_SETTING)
    if isinstance(exc, DeltaError | OSError | TimeoutError | ConnectionError):
        return RetryableUploadError(f"{what} failed: {detail}", reason="delta_io")
    return FatalUploadError(f"{what} failed: {detail}; this will not be retried. Check {TABLE_URI_SETTING} "
                            f"and {HARD_DELETES_SETTING}.", reason="delta_error", setting=TABLE_URI_SETTING)
