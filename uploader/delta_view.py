"""What a reader of a change-log-mode Delta table sees: the keyed table with the change log applied on read.

The keyed table alone is as fresh as its last compaction (uploader.delta_compaction); the change log holds
every micro-batch since, appended before the Kafka commit. The current rows are, per primary key, the latest of
the key's row in the keyed table and its rows in the change log not yet applied to it (at or above its bucket's
floor, uploader.delta_changes.Stamps), under the
merge's rule: the highest order value wins and a tie keeps the earlier (the keyed table's, then the lower change
version); without an order column the latest change wins. Under hard deletes a winning `_deleted` row means the
key has no row. README's *Delta Lake target* gives the same view as SQL for other engines.

Memory: the change log's pending rows and the keyed table's rows of the keys they touch; the keyed table's
other rows stream through in batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from uploader.column_types import conform, join_schemas
from uploader.delta import DELETED, latest_per_key
from uploader.delta_changes import CHANGE_VERSION, Stamps, key_text
from uploader.delta_changes import pending as changes_pending
from uploader.delta_log import CommitLog
from uploader.delta_settings import DeltaSettings
from uploader.delta_storage import storage_options

_BASE_VERSION = -1  # the keyed table's rows rank before every change


def current_batches(settings: DeltaSettings, topic: str, keys: Sequence[str],
                    order: str | None) -> tuple[pa.Schema, Iterator[pa.RecordBatch]] | None:
    """The current rows of the topic's table (keyed table plus change log) as batches of one schema; None when
    neither table exists."""
    options = storage_options(settings) or None
    # The change log first: a compaction that commits between the two snapshots is then in the keyed table's,
    # and the rows it applied are still in the change log's (deleted only KEEP_APPLIED_S later).
    changes = _open(settings.changes_uri_for(topic), options)
    keyed = _open(settings.uri_for(topic), options)
    if changes is None:
        if keyed is None:
            return None
        schema = pa.schema(keyed.schema().to_arrow())
        return schema, iter(keyed.to_pyarrow_dataset().to_batches())
    applied = {b: keyed.transaction_version(settings.compaction_app_id(b)) if keyed is not None else None
               for b in range(settings.buckets)}
    log = CommitLog(settings, settings.changes_uri_for(topic))
    try:
        pending = changes_pending(changes, Stamps(log).floors(changes, applied))
    finally:
        log.close()
    schema = pa.schema(changes.schema().to_arrow())
    schema = schema.remove(schema.get_field_index(CHANGE_VERSION))
    if keyed is not None:
        schema = join_schemas(pa.schema(keyed.schema().to_arrow()), schema)
    return schema, _merged(keyed, pending, schema, keys, order, settings.hard_deletes)


def current_rows(settings: DeltaSettings, topic: str, keys: Sequence[str], order: str | None) -> pa.Table:
    """`current_batches` as one table (tests and small tables); empty when there is no table."""
    found = current_batches(settings, topic, keys, order)
    if found is None:
        return pa.table({})
    schema, batches = found
    return pa.Table.from_batches(list(batches), schema)


def _merged(keyed: DeltaTable | None, pending: pa.Table, schema: pa.Schema, keys: Sequence[str],
            order: str | None, hard_deletes: bool) -> Iterator[pa.RecordBatch]:
    changed = pc.unique(key_text(pending, keys)) if keys else pa.array([], pa.string())
    touched: list[pa.Table] = []
    if keyed is not None:
        for batch in keyed.to_pyarrow_dataset().to_batches():
            rows = pa.Table.from_batches([batch])
            hit = pc.is_in(key_text(rows, keys), changed) if keys else pa.repeat(False, rows.num_rows)
            untouched = rows.filter(pc.invert(hit))
            if untouched.num_rows:
                yield from conform(untouched, schema).to_batches()
            if keys and pc.any(hit).as_py():
                touched.append(rows.filter(hit).append_column(
                    CHANGE_VERSION, pa.repeat(pa.scalar(_BASE_VERSION, pa.int64()), pc.sum(hit).as_py())))
    candidates = [conform(t, schema) for t in [*touched, pending]]
    rows = pa.concat_tables(candidates, promote_options="permissive")
    if rows.num_rows == 0:
        return
    rows = rows.take(pc.sort_indices(rows, [(CHANGE_VERSION, "ascending")]))
    if keys:
        rows = latest_per_key(rows, keys, order, file_column=CHANGE_VERSION)
    if hard_deletes and DELETED in rows.column_names:
        rows = rows.filter(pc.invert(pc.fill_null(rows[DELETED], False)))
    yield from conform(rows.drop_columns([CHANGE_VERSION]), schema).to_batches()


def _open(uri: str, options: dict | None) -> DeltaTable | None:
    try:
        return DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        return None
