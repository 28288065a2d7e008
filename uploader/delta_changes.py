"""Change-log mode of the Delta target: each micro-batch appends to a change log; the keyed table follows later.

A merge into a large keyed table rewrites every file holding one of its keys (delta-rs merges are
copy-on-write), so with updates spread over the keys each micro-batch rewrote the whole table: the bytes
written grew with the table, not with the updates (bench/README.md, *Delta tables of 10M keys*). In this mode
(`SINK_DELTA_CHANGE_LOG=true`):

- a micro-batch's rows, the latest per key, are APPENDED to a second Delta table beside the keyed one,
  `<table>__changes`, partitioned by `_bucket` (a hash of the primary key) and stamped `_change_version`, one
  above the change-log version they were written on. The commit carries every partition's application
  transaction, as a merge does, so a replay is never appended twice and the Kafka commit follows it. delta-rs
  rebases an append over other instances' appends (a commit carrying one of its application transactions still
  fails it), so the commit may land above its stamp: a stamp orders one key's rows (a partition's appends follow
  one another) and is no version by itself. Which rows a compaction has applied is read from the commits'
  stamps (`Stamps`);
- the keyed table (partitioned by `_bucket`) takes the change log in per-bucket compactions
  (uploader.delta_compaction) once the change log holds a share of its bytes, each a merge pinned to one
  bucket that records the change-log version it applied as the bucket's application transaction;
- a reader sees every record at once through the view (uploader.delta_view): the keyed table and the change
  log, the latest row per key under the order-column rule.

Everything else is the merge mode's: types fitted to the change log's (which starts from the keyed table's),
widening, bad values, exactly-once checks, conflicts retried.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, write_deltalake

from uploader.delta import (
    _FILE,
    CONFLICT,
    BadValues,
    DeltaFile,
    DeltaTarget,
    _in_small_batches,
    _Piece,
    latest_per_key,
)
from uploader.delta_log import CommitLog
from uploader.delta_settings import BUCKET, DeltaSettings
from uploader.errors import RetryableUploadError

CHANGE_VERSION = "_change_version"  # one above the change-log version the row was written on: later wins a tie
# Each append's commit info names the keys and order column its rows are merged by: a compaction after a restart
# finds them there before any new batch (keys may come from the Kafka key, known only from the files).
META_KEYS = "kafka_parquet_sink.keys"
# ... and the stamp of its rows, which sits below the commit's version when delta-rs rebased the append.
META_STAMP = "kafka_parquet_sink.change_version"
APPEND_TRIES_AT_ONCE = 3
APPEND_COMMIT_RETRIES = 25  # rebases over other writers' commits: each is one more log entry read, nothing rewritten
_KEY_SEPARATOR = "\x1f"


def key_text(rows: pa.Table, keys: Sequence[str]) -> pa.ChunkedArray | pa.Array:
    """Each row's primary key as one text (parts joined by U+001F): a key column the decode lattice widened (an
    int key now read as text) keeps its text, `7` and `"7"` alike."""
    texts = [pc.fill_null(pc.cast(rows[k], pa.string()), "") for k in keys]
    return texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, _KEY_SEPARATOR)


def buckets_of(rows: pa.Table, keys: Sequence[str], buckets: int) -> pa.Array:
    """Each row's bucket: CRC-32 of its key's UTF-8 text modulo `buckets`; stable across processes and versions,
    unlike Python's `hash`."""
    if not keys:
        return pa.repeat(pa.scalar(0, pa.int32()), rows.num_rows)
    return pa.array((crc32_each(key_text(rows, keys)) % buckets).astype(np.int32))


def _crc_table() -> np.ndarray:
    """zlib's CRC-32 (reflected polynomial 0xEDB88320), one entry per byte value."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc_table()


def crc32_each(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """zlib.crc32 of each text's UTF-8 bytes, a byte position at a time over every row at once (a Python call per
    row took a quarter of an append's time: 53 ms for 100k keys)."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    texts = pc.cast(texts, pa.large_string())
    offsets = np.frombuffer(texts.buffers()[1], np.int64, len(texts) + 1, texts.offset * 8)
    data = np.frombuffer(texts.buffers()[2] or b"", np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    crc = np.full(len(texts), 0xFFFFFFFF, np.uint32)
    for position in range(int(lengths.max()) if len(texts) else 0):
        rows = np.flatnonzero(lengths > position)
        byte = data[starts[rows] + position]
        crc[rows] = _CRC_TABLE[(crc[rows] ^ byte) & 0xFF] ^ (crc[rows] >> 8)
    return crc ^ 0xFFFFFFFF


def pending(changes: DeltaTable, floors: Mapping[int, int | None]) -> pa.Table:
    """The change log's rows of the buckets `floors` names, at or above each one's floor (`Stamps.floors`; None:
    all)."""
    condition = None
    for bucket, floor in floors.items():
        clause = ds.field(BUCKET) == bucket
        if floor is not None:
            clause = clause & (ds.field(CHANGE_VERSION) >= floor)
        condition = clause if condition is None else condition | clause
    return changes.to_pyarrow_dataset().to_table(filter=condition)


class Stamps:
    """The stamps of the change log's appends, read from their commit infos once per version (a log entry never
    changes, and one the log's clean-up removed never comes back): which rows a compaction through a version has not
    applied.

    A row appended after version `a` carries a stamp of at least `floor(a)`, the lowest stamp of the appends
    committed after `a` (or `a + 1`). Rows below it were committed at or below `a`: applied by a compaction through
    `a`. At or above it may be rows committed before `a` too (a rebased append's stamp sits below its version):
    taking them again is harmless, since a merge keeps the row with the highest order value, and without an order
    column the later stamp of the same key wins, whose row the clean-up never deletes before the earlier one's (it
    deletes below a floor, and one key's rows come from one partition, whose appends follow one another)."""

    def __init__(self, log: CommitLog) -> None:
        self.log = log
        self._of: dict[int, int | None] = {}  # version -> its rows' stamp (None: no append of this mode's)
        self._gone: set[int] = set()  # versions whose log entry the clean-up removed: no floor through them

    def floors(self, changes: DeltaTable, applied: Mapping[int, int | None],
               actions: pa.Table | None = None) -> dict[int, int | None]:
        """Per bucket, the lowest stamp of a row appended after its applied version, as of the snapshot `changes`
        (None: every row may be pending: the bucket was never compacted, the log no longer reaches back, or it has
        no rows in the change log, so that a bucket whose keys stopped changing does not hold the log's reading
        back at its last compaction). `actions`: the snapshot's `add_actions`, when the caller has read them."""
        holding = _buckets_holding_rows(add_actions(changes) if actions is None else actions)
        known = [a for b, a in applied.items() if a is not None and b in holding]
        if not known:
            return dict.fromkeys(applied)
        newest = changes.version()
        self._read(min(known) + 1, newest)
        floors: dict[int, int | None] = {}
        for bucket, after in applied.items():
            versions = range(after + 1, newest + 1) if after is not None and bucket in holding else None
            if versions is None or any(v not in self._of for v in versions):
                floors[bucket] = None
                continue
            floors[bucket] = min([after + 1, *(s for v in versions if (s := self._of[v]) is not None)])
        return floors

    def _read(self, first: int, last: int) -> None:
        """The stamps of versions `first`..`last` not read before; a missing entry is remembered as such (it sits
        below the log's oldest entry: on S3 it would be one 404 per check, forever)."""
        for version in range(first, last + 1):
            if version in self._of or version in self._gone:
                continue
            if (info := self.log.commit_info(version)) is None:
                self._gone.add(version)
                continue
            stamp = info.get(META_STAMP)
            self._of[version] = int(stamp) if stamp is not None else None
        for version in [v for v in self._of if v < first]:  # below the oldest applied version: never asked again
            del self._of[version]
        self._gone = {v for v in self._gone if v >= first}


def add_actions(changes: DeltaTable) -> pa.Table:
    """The snapshot's files, one row each, partition values and statistics flattened into columns: read once per
    compaction check, for both the buckets holding rows and the pending bytes (delta-rs builds the table anew at
    each call)."""
    return pa.table(changes.get_add_actions(flatten=True))  # deltalake hands an arro3 table


def _buckets_holding_rows(actions: pa.Table) -> set[int]:
    if actions.num_rows == 0:
        return set()
    return {int(b) for b in pc.unique(actions.column(f"partition.{BUCKET}")).to_pylist() if b is not None}


class ChangeLogTarget(DeltaTarget):
    """Appends each merge's rows (the latest per key) to the change log, exactly once per partition range."""

    def __init__(self, settings: DeltaSettings) -> None:
        super().__init__(settings)
        self._keyed = DeltaTarget(settings)  # the keyed table: its progress counts (a table written in merge mode)
        self._keyed_now: dict[str, DeltaTable | None] = {}  # topic -> the keyed table, read once per attempt

    def uri_for(self, topic: str) -> str:
        return self.settings.changes_uri_for(topic)

    def _apply(self, files: Sequence[DeltaFile], uri: str, by_hand: bool = False,
               on_bad_values: BadValues | None = None) -> dict[str, Any]:
        """An append that lost its commit race is tried again at once, a few times, before the backoff of the
        caller's retries. delta-rs rebases it over other appends; what still fails it is a commit that removed
        files (the clean-up of applied rows, after each compaction: delta-rs's appends are not blind) or one
        carrying its application transactions (a zombie's). Each try re-reads the transactions, as a retry after
        a wait would."""
        for attempt in range(1, APPEND_TRIES_AT_ONCE + 1):
            self._keyed_now.clear()
            try:
                return super()._apply(files, uri, by_hand, on_bad_values)
            except RetryableUploadError as exc:
                if exc.reason != CONFLICT or attempt == APPEND_TRIES_AT_ONCE:
                    raise
        raise AssertionError("unreachable")

    def covered_to(self, topic: str, partition: int) -> int | None:
        self._keyed_now.clear()
        return super().covered_to(topic, partition)

    def _progress_elsewhere(self, topic: str, app_id: str) -> int | None:
        """A keyed table written in merge mode before holds its partitions' progress itself."""
        if topic not in self._keyed_now:
            self._keyed_now[topic] = self._keyed._open(self.settings.uri_for(topic))
        table = self._keyed_now[topic]
        return table.transaction_version(app_id) if table is not None else None

    def _new_table_schema(self, rows: pa.Schema, topic: str) -> pa.Schema:
        """The keyed table's columns when it exists (so the change log's types are never narrower), else the
        first rows'; and the bucket and version columns."""
        keyed = self._keyed._open(self.settings.uri_for(topic))
        schema = pa.schema(keyed.schema().to_arrow()) if keyed is not None else rows
        for name, type_ in ((BUCKET, pa.int32()), (CHANGE_VERSION, pa.int64())):
            if name not in schema.names:
                schema = schema.append(pa.field(name, type_))
        return schema

    def _partition_by(self) -> tuple[str, ...]:
        return (BUCKET,)

    def _maintenance_settings(self) -> DeltaSettings:
        """No small-file compaction of the change log: its files live until the next compaction reads them, and an
        OPTIMIZE mixing applied and pending rows in one file makes the later clean-up rewrite the pending ones and
        `due()` count the applied ones (bench: 0.15x of the updates' bytes at 10M keys). Vacuum stays, and
        delta-rs's own checkpoints and log clean-up."""
        return dataclasses.replace(self.settings, compact_every_commits=0)

    def _commit_info(self, pieces: Sequence[_Piece]) -> dict[str, str]:
        m = pieces[0].metadata
        return {META_KEYS: json.dumps({"primary_keys": list(m.primary_keys), "order_column": m.order_column})}

    def _write(self, table: DeltaTable, rows: pa.Table, keys: Sequence[str], order: str | None,
               commit: CommitProperties, pin: str | None = None) -> dict[str, Any]:
        if keys:
            rows = latest_per_key(rows, keys, order, file_column=_FILE)
        rows = rows.drop_columns([_FILE])
        stamp = table.version() + 1
        stamped = {BUCKET: buckets_of(rows, keys, self.settings.buckets),
                   CHANGE_VERSION: pa.repeat(pa.scalar(stamp, pa.int64()), rows.num_rows)}
        for name, values in stamped.items():
            rows = rows.set_column(rows.schema.get_field_index(name), name, values)
        rebased = CommitProperties(app_transactions=commit.app_transactions, max_commit_retries=APPEND_COMMIT_RETRIES,
                                   custom_metadata={**(commit.custom_metadata or {}), META_STAMP: str(stamp)})
        write_deltalake(table, _in_small_batches(rows), mode="append", schema_mode="merge", commit_properties=rebased)
        return {"num_target_rows_inserted": rows.num_rows}


def delta_target(settings: DeltaSettings) -> DeltaTarget:
    """The target the settings ask for: the change log in change-log mode, else the keyed table itself."""
    return ChangeLogTarget(settings) if settings.change_log else DeltaTarget(settings)


def merged_by(changes: DeltaTable, log: CommitLog, commits: int = 100) -> tuple[tuple[str, ...], str | None] | None:
    """The keys and order column the change log's latest appends were merged by (None if none in `commits`)."""
    newest = changes.version()
    for version in range(newest, max(-1, newest - commits), -1):
        text = (log.commit_info(version) or {}).get(META_KEYS)
        if text:
            found = json.loads(text)
            return tuple(found["primary_keys"]), found["order_column"]
    return None
