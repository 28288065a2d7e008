"""Compaction of a change log into its keyed Delta table, bucket by bucket (change-log mode, uploader.delta_changes).

Why it keeps the bytes written near the updates': a compaction rewrites the keyed table's files (copy-on-write),
so it runs only once the change log holds `compact_at_ratio` of the keyed table's bytes (or after
`compact_max_interval_s`). The bytes written per update are then about 1 (the append) + 1 / ratio (the rewrite):
about 4.3x at the default 0.30, whatever the table's size.

One bucket at a time, each a merge pinned to its `_bucket` partition: it reads and rewrites only that bucket's
files, its source is the bucket's changes (memory ~ the change log / buckets), and two writers compacting
different buckets commit beside each other.

Exactly once per bucket: the merge's commit carries the application transaction
`kafka-parquet-sink/<group>/compacted-changes/<bucket>` = the change-log version it applied through, and is made
with `max_commit_retries=0` after re-reading that transaction; a rival's compaction in between fails it and the
retry starts from the rival's progress. The rows still to apply are those at or above the floor of the appends
committed since (uploader.delta_changes.Stamps: a rebased append's stamp sits below its version). Rows of a bucket
below that floor are deleted from the change log (by predicate, whole files: nothing rewritten) once the
transaction is KEEP_APPLIED_S old: a reader takes two snapshots (the keyed table's and the change log's), and one
that took the keyed table's before the compaction committed still finds the changes in the change log's. A crash
in between leaves rows the view and the next compaction both skip, since the floor says they are applied.
"""

from __future__ import annotations

import logging
import pathlib
import random
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from uploader.delta import _FILE, CONFLICT, DeltaTarget, _Piece, _with_every_column, classify_error
from uploader.delta_changes import CHANGE_VERSION, Stamps, add_actions, merged_by, pending
from uploader.delta_log import CommitLog
from uploader.delta_maintenance import maintain
from uploader.delta_settings import BUCKET, DeltaSettings
from uploader.delta_storage import storage_options
from uploader.errors import RetryableUploadError, UploadError
from uploader.retry import OnRetry, call_with_retries
from uploader.target import FileMetadata

log = logging.getLogger(__name__)

# Applied rows stay in the change log this long after the compaction that applied them: readers whose two
# snapshots are taken at most this far apart never miss a change (README, *Delta Lake target*).
KEEP_APPLIED_S = 60.0
DELETE_TRIES_AT_ONCE = 3  # the clean-up loses to an append into its buckets (delta-rs): re-read, tried again at once


@dataclass(frozen=True)
class Sizes:
    """Bytes of the change log's files holding changes not yet compacted, and of the keyed table."""

    changes: int
    table: int


class Compaction:
    """Compacts one topic's change log into its keyed table; one instance per driver, called from one thread."""

    def __init__(self, settings: DeltaSettings, scratch: pathlib.Path, keep_applied_s: float = KEEP_APPLIED_S,
                 first_bucket: int | None = None) -> None:
        self.settings = settings
        # Instances of one group each run their compactions, usually at the same moments (both see the change log
        # reach its share): starting at a bucket of its own, each takes different buckets first, and finds those the
        # other applied meanwhile with nothing left to apply, instead of both merging every bucket.
        self.first_bucket = random.randrange(settings.buckets) if first_bucket is None else first_bucket
        self.keyed = DeltaTarget(settings)
        self.scratch = scratch
        self.keep_applied_s = keep_applied_s
        self._last: dict[str, float] = {}  # uri -> when its last compaction ended (monotonic)
        self._stamps: dict[str, Stamps] = {}  # change log's uri -> its stamps
        self._change_logs: dict[str, tuple[DeltaTable, tuple]] = {}  # uri -> (table, the storage options it has)
        # uri -> (when, each bucket's applied version) after each compaction, oldest first: what may be deleted
        self._applied: dict[str, list[tuple[float, dict[int, int | None]]]] = {}

    def sizes(self, topic: str) -> Sizes | None:
        """None when there is no change log yet."""
        changes = self._changes(topic)
        if changes is None:
            return None
        uri = self.settings.uri_for(topic)
        keyed = self.keyed._open(uri)
        applied = {b: _applied(keyed, self.settings.compaction_app_id(b)) for b in range(self.settings.buckets)}
        actions = add_actions(changes)
        return Sizes(_pending_bytes(actions, self._floors(changes, applied, actions)), _bytes(keyed) if keyed else 0)

    def merged_by(self, topic: str) -> tuple[tuple[str, ...], str | None] | None:
        """The keys and order column of the topic's change log (from its appends' commit info); None without one."""
        changes = self._changes(topic)
        return merged_by(changes, self._stamps_of(changes).log) if changes is not None else None

    def due(self, topic: str, now: float | None = None) -> bool:
        """The change log holds `compact_at_ratio` of the keyed table's bytes, or the last compaction is
        `compact_max_interval_s` old and there are changes."""
        sizes = self.sizes(topic)
        if sizes is None or sizes.changes == 0:
            return False
        now = time.monotonic() if now is None else now
        last = self._last.setdefault(self.settings.uri_for(topic), now)
        return (sizes.changes >= self.settings.compact_at_ratio * sizes.table
                or now - last >= self.settings.compact_max_interval_s)

    def compact(self, topic: str, keys: Sequence[str], order: str | None, on_retry: OnRetry | None = None,
                stop: threading.Event | None = None) -> dict[str, Any]:
        """Apply the change log, as of its newest version, to the keyed table bucket by bucket; delete what is
        applied from the change log. Returns counts; raises what a merge would (RetryableUploadError, ...).
        `stop` set: return after the bucket at hand (each bucket is its own commit; the rest waits)."""
        uri = self.settings.uri_for(topic)
        started = time.monotonic()
        changes = self._changes(topic)
        if changes is None:
            return {"buckets": 0}
        totals: dict[str, Any] = {"buckets": 0, "rows": 0, "version": changes.version()}
        keyed = self.keyed._open(uri)
        pinned = keyed is None or BUCKET in keyed.metadata().partition_columns
        own_first = [(self.first_bucket + n) % self.settings.buckets for n in range(self.settings.buckets)]
        groups = [[b] for b in own_first] if pinned else [list(range(self.settings.buckets))]
        for buckets in groups:
            if stop is not None and stop.is_set():
                break
            counts, _ = call_with_retries(lambda _attempt, b=buckets: self._compact(changes, topic, b, keys, order),
                                          self.settings.retry, on_retry)
            if counts:
                totals["buckets"] += len(buckets)
                totals["rows"] += counts.get("rows", 0)
                for name, value in counts.items():
                    if name.startswith("num_"):
                        totals[name] = totals.get(name, 0) + value
        self._delete_applied(changes, uri)
        self._last[uri] = time.monotonic()
        totals["duration_s"] = round(time.monotonic() - started, 3)
        return totals

    def close(self) -> None:
        """Close the S3 clients the log readers hold (one per change log on S3; a later check opens a new one)."""
        stamps, self._stamps = list(self._stamps.values()), {}
        for held in stamps:
            held.log.close()

    def _changes(self, topic: str) -> DeltaTable | None:
        """The change log's newest snapshot, in an object of its own (a compaction works on one version while
        batches append), brought up to date by reading only the log entries since the last look: a fresh load
        reads the last checkpoint and up to 100 entries after it, after every batch and every 10 s."""
        uri, options = self.settings.changes_uri_for(topic), storage_options(self.settings)
        held = self._change_logs.get(uri)
        if held is not None and held[1] == tuple(sorted(options.items())):
            held[0].update_incremental()
            return held[0]
        try:
            table = DeltaTable(uri, storage_options=options or None)
        except TableNotFoundError:
            return None
        self._change_logs[uri] = (table, tuple(sorted(options.items())))
        return table

    def _compact(self, changes: DeltaTable, topic: str, buckets: list[int], keys: Sequence[str],
                 order: str | None) -> dict[str, Any]:
        uri = self.settings.uri_for(topic)
        keyed = self.keyed._open(uri)
        try:
            done = {b: _applied(keyed, self.settings.compaction_app_id(b)) for b in buckets}
            rows = pending(changes, self._floors(changes, done))
            if rows.num_rows == 0:
                return {}
            if keyed is None:
                keyed = self.keyed._create(uri, pa.schema(changes.schema().to_arrow()).remove(
                    pa.schema(changes.schema().to_arrow()).get_field_index(CHANGE_VERSION)))
            rows = self._fitted(rows, keyed, topic, buckets, keys, order, changes.version())
            seen = {b: _applied(keyed, self.settings.compaction_app_id(b)) for b in buckets}
            if seen != done:
                raise RetryableUploadError(f"compaction of {uri}: another writer compacted buckets {buckets} meanwhile",
                                           reason=CONFLICT)
            commit = CommitProperties(
                app_transactions=[Transaction(self.settings.compaction_app_id(b), changes.version()) for b in buckets],
                max_commit_retries=0)
            pin = f"t.`{BUCKET}` = {buckets[0]}" if len(buckets) == 1 else None
            read_version = keyed.version()
            counts = self.keyed._write(keyed, rows, keys, order, commit, pin)
            if keyed.version() == read_version:  # no row changed: the progress is recorded all the same
                write_deltalake(keyed, rows.drop_columns([_FILE]).slice(0, 0), mode="append", schema_mode="merge",
                                commit_properties=commit)
            keyed.update_incremental()
            maintenance = maintain(keyed, self.settings, keyed.version())  # never raises
            if maintenance:
                counts = {**counts, "maintenance": maintenance}
        except UploadError:
            self.keyed._forget(uri)
            raise
        except Exception as exc:
            self.keyed._forget(uri)
            raise classify_error(exc, what=f"compaction of the change log into {uri} (buckets {buckets})",
                                 files=[_describe(topic, buckets, changes.version(), keys, order)]) from exc
        log.debug("compacted %s buckets %s through change-log version %d: %s", uri, buckets, changes.version(), counts)
        return {"rows": rows.num_rows, **counts}

    def _fitted(self, rows: pa.Table, keyed: DeltaTable, topic: str, buckets: list[int], keys: Sequence[str],
                order: str | None, version: int) -> pa.Table:
        """The changes in the keyed table's types (widened first where needed), tagged `_FILE` with their change-log
        version in version order: a tie on the order column keeps the earlier version's row; without one, the last."""
        rows = rows.take(pc.sort_indices(rows, [(CHANGE_VERSION, "ascending")]))
        versions = rows[CHANGE_VERSION]
        metadata = _describe(topic, buckets, version, keys, order)
        piece = _Piece(metadata, rows.drop_columns([CHANGE_VERSION]), "", 0)
        uri = self.settings.uri_for(topic)
        self.scratch.mkdir(parents=True, exist_ok=True)
        fitted, wider, _ = self.keyed._fit(piece, keyed, uri, tolerate=False)
        if wider:
            with tempfile.TemporaryDirectory(dir=self.scratch) as tmp:
                keyed = self.keyed._widen(keyed, wider, metadata, uri, pathlib.Path(tmp))
            fitted, wider, _ = self.keyed._fit(piece, keyed, uri, tolerate=False)
            if wider:
                raise RetryableUploadError(f"compaction into {uri}: the table's schema changed meanwhile",
                                           reason=CONFLICT)
        fitted = fitted.append_column(_FILE, versions.cast(pa.int32()))
        return _with_every_column(fitted, pa.schema(keyed.schema().to_arrow()))

    def _floors(self, changes: DeltaTable, applied: dict[int, int | None],
                actions: pa.Table | None = None) -> dict[int, int | None]:
        return self._stamps_of(changes).floors(changes, applied, actions)

    def _stamps_of(self, changes: DeltaTable) -> Stamps:
        if changes.table_uri not in self._stamps:
            self._stamps[changes.table_uri] = Stamps(CommitLog(self.settings, changes.table_uri))
        return self._stamps[changes.table_uri]

    def _delete_applied(self, changes: DeltaTable, uri: str) -> None:
        """Delete from the change log the rows the keyed table's bucket transactions said it held at least
        `keep_applied_s` ago (this process's compactions: after a restart, from its first one on): those below
        the floor of the appends committed since, read on the snapshot the delete commits from (a later append
        is not in it, so never deleted)."""
        keyed = self.keyed._open(uri)
        if keyed is None:
            return
        now = time.monotonic()
        history = self._applied.setdefault(uri, [])
        history.append((now, {b: _applied(keyed, self.settings.compaction_app_id(b))
                              for b in range(self.settings.buckets)}))
        old = [done for at, done in history if now - at >= self.keep_applied_s]
        if not old:
            return
        done = old[-1]
        history[:] = [(at, d) for at, d in history if now - at < self.keep_applied_s]
        for attempt in range(1, DELETE_TRIES_AT_ONCE + 1):
            try:
                changes.update_incremental()
                floors = self._floors(changes, done)
                clauses = [f"(`{BUCKET}` = {b} AND `{CHANGE_VERSION}` < {floor})"
                           for b, floor in floors.items() if floor is not None]
                if clauses:
                    changes.delete(" OR ".join(clauses), commit_properties=CommitProperties(max_commit_retries=5))
                return
            except Exception as exc:  # never fails the compaction: the view and the next one skip applied rows
                if attempt == DELETE_TRIES_AT_ONCE:
                    history.insert(0, (now - self.keep_applied_s, done))  # deleted by the next compaction
                    log.warning("could not delete compacted rows from the change log of %s (the next compaction "
                                "will): %s", uri, exc)


def _applied(table: DeltaTable | None, app_id: str) -> int | None:
    return table.transaction_version(app_id) if table is not None else None


def _pending_bytes(actions: pa.Table, floors: dict[int, int | None]) -> int:
    """Bytes of the change-log files (`add_actions`) holding a row at or above its bucket's floor (by the files'
    statistics: an append writes one file per bucket, all of one stamp). Rows applied and kept for readers do not
    count."""
    if actions.num_rows == 0:
        return 0
    newest = actions.column(f"max.{CHANGE_VERSION}").to_pylist()
    buckets = actions.column(f"partition.{BUCKET}").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    return sum(size for size, bucket, stamp in zip(sizes, buckets, newest, strict=True)
               if stamp is None or floors.get(int(bucket)) is None or stamp >= floors[int(bucket)])


def _bytes(table: DeltaTable) -> int:
    actions = add_actions(table)
    return int(pc.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0


def _describe(topic: str, buckets: list[int], version: int, keys: Sequence[str], order: str | None) -> FileMetadata:
    """For messages naming what a compaction applied: the change log's buckets through a version."""
    return FileMetadata(topic=topic, partition=buckets[0] if len(buckets) == 1 else -1, first_offset=0,
                        last_offset=version, record_count=0, target_table="", primary_keys=tuple(keys),
                        order_column=order, schema_fingerprint=f"changes-buckets-{buckets[0]}-{buckets[-1]}")
