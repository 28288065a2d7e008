"""The Delta table equals each key's latest record, field by field, however the files are batched into merges.

Files are written by the service's own writer (sink_service.task.parquet_files), so they have the shapes
real topics give them: a column that holds only nulls left out, a struct that grows a field, a file of
tombstones that carries no value column. Each scenario is applied in three batchings (every file in its
own merge, all files in one merge, and pairs), and each key's row is compared with the model: the latest
record, a field it lacks (or holds null) is null, a soft-deleted key keeps only its key and metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sink_service.task.parquet_files import ClosedFile, PartitionFileWriter
from uploader.delta import DeltaFile, DeltaRefusal, DeltaTarget
from uploader.delta_settings import DeltaSettings
from uploader.retry import RetryPolicy
from uploader.target import FileMetadata

FAST = RetryPolicy(max_elapsed_s=20.0, initial_backoff_s=0.01, max_backoff_s=0.2)
TOPIC = "orders"

Record = dict[str, Any]  # the record's value fields; `None` for a tombstone (soft delete)


def _files(tmp: Path, phases: Sequence[Sequence[tuple[int, Record | None]]], *, bookkeeping: bool = False,
           start: int = 0, keys: tuple[str, ...] = ("id",), partition: int = 0) -> list[DeltaFile]:
    """One file per phase, in offset order, written as a task writes them for a Delta table."""
    closed: list[ClosedFile] = []
    writer = PartitionFileWriter(tmp / "files" / str(start), TOPIC, partition, max_bytes=1 << 30, max_records=1 << 30,
                                 compression="zstd", on_close=closed.append,
                                 bookkeeping=("_offset",) if bookkeeping else (), typed_table=True)
    offset = start
    for phase in phases:
        rows: list[Record] = []
        for key, value in phase:
            row = {"id": key, "_offset": offset, "_deleted": value is None}
            row.update(value or {})
            rows.append(row)
            offset += 1
        for row in rows:  # a record per chunk: the writer joins their types as the decoder would (lattice)
            writer.append(pa.Table.from_pylist([row]))
        writer.finish()
    return [DeltaFile(c.path, FileMetadata(
        topic=TOPIC, partition=partition, first_offset=c.first_offset, last_offset=c.last_offset,
        record_count=c.record_count, target_table=TOPIC, primary_keys=keys,
        order_column="_offset" if not bookkeeping else "version",
        schema_fingerprint=c.schema_fingerprint)) for c in closed]


def _expected(phases: Sequence[Sequence[tuple[int, Record | None]]], start: int = 0) -> dict[int, Record]:
    latest: dict[int, Record] = {}
    offset = start
    for phase in phases:
        for key, value in phase:
            latest[key] = {"id": key, "_offset": offset, "_deleted": value is None, **(value or {})}
            offset += 1
    return {k: _without_nulls(v) for k, v in latest.items()}


def _without_nulls(value: Any) -> Any:
    """Null and absent are the same value: compared without them, so a cleared field must be null."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _table_rows(uri: str) -> dict[int, Record]:
    return {r["id"]: _without_nulls(r) for r in DeltaTable(uri).to_pyarrow_table().to_pylist()}


BATCHINGS = {
    "each file alone": lambda n: [[i] for i in range(n)],
    "all in one merge": lambda n: [list(range(n))],
    "pairs": lambda n: [list(range(i, min(n, i + 2))) for i in range(0, n, 2)],
}


def _apply(tmp: Path, files: list[DeltaFile], batching: str, **settings: Any) -> str:
    uri = str(tmp / "table")
    target = DeltaTarget(DeltaSettings(table_uri=uri, group_id="g", retry=FAST, **settings))
    for group in BATCHINGS[batching](len(files)):
        target.merge([files[i] for i in group])
    return uri


CUSTOMER_GROWS = [
    [(k, {"amount": 10 + k, "coupon": f"c{k}", "customer": {"name": "n"}}) for k in range(6)],
    [(k, {"amount": 20 + k, "coupon": f"d{k}", "customer": {"name": "n2", "email": "e"}}) for k in range(3)],
]
SOFT_DELETES = [[(4, None), (5, None)]]
CLEARED = [[(0, {"amount": 30, "coupon": None, "customer": {"name": "n3"}})]]  # coupon all null: left out
LIST_OF_STRUCTS_GROWS = [
    [(1, {"amount": 1, "items": [{"sku": "a"}]})],
    [(2, {"amount": 2, "items": [{"sku": "b", "qty": 3}]})],
]


@pytest.mark.parametrize("batching", list(BATCHINGS))
def test_fields_new_inside_objects_cleared_fields_and_soft_deletes_end_exact(tmp_path: Path, batching: str) -> None:
    phases = [*CUSTOMER_GROWS, *SOFT_DELETES, *CLEARED, *LIST_OF_STRUCTS_GROWS]
    uri = _apply(tmp_path, _files(tmp_path, phases), batching)
    assert _table_rows(uri) == _expected(phases)


@pytest.mark.parametrize("batching", list(BATCHINGS))
def test_a_struct_widened_by_one_file_keeps_every_other_rows_values(tmp_path: Path, batching: str) -> None:
    """delta-rs's own nested schema evolution in a merge nulls the struct of the rows it copies."""
    phases = [
        [(k, {"customer": {"name": f"n{k}", "tier": k}}) for k in range(5)],
        [(0, {"customer": {"name": "m", "email": "e"}})],
        [(1, {"customer": {"tier": 9, "email": "f"}})],
    ]
    uri = _apply(tmp_path, _files(tmp_path, phases), batching)
    assert _table_rows(uri) == _expected(phases)
    customer = pa.schema(DeltaTable(uri).schema().to_arrow()).field("customer").type
    assert sorted(f.name for f in customer) == ["email", "name", "tier"]


@pytest.mark.parametrize("batching", list(BATCHINGS))
def test_a_record_that_clears_every_value_field_clears_the_row(tmp_path: Path, batching: str) -> None:
    phases = [[(1, {"amount": 5, "customer": {"name": "n"}})], [(1, {"amount": None})]]
    uri = _apply(tmp_path, _files(tmp_path, phases), batching)
    assert _table_rows(uri) == {1: {"id": 1, "_offset": 1, "_deleted": False}}


@pytest.mark.parametrize("batching", list(BATCHINGS))
def test_hard_deletes_end_the_same_whatever_the_batching(tmp_path: Path, batching: str) -> None:
    """Ordered by offset (SINK_DELTA_HARD_DELETES requires it), a later merge never carries an older row of a
    deleted key, so a key deleted and then written again, or deleted for good, ends the same in every batching."""
    phases = [[(1, {"amount": 1}), (2, {"amount": 2})], [(1, None)], [(1, {"amount": 3}), (2, None)], [(3, None)]]
    uri = _apply(tmp_path, _files(tmp_path, phases), batching, hard_deletes=True)
    assert _table_rows(uri) == {k: v for k, v in _expected(phases).items() if not v["_deleted"]}


def test_a_value_a_column_cannot_take_costs_its_record_and_the_rest_of_its_file_merges(tmp_path: Path) -> None:
    """Text beside numbers in one file (the lattice wrote its numbers as their digits): the exact numbers
    merge as numbers, and only the records whose text is no number are handed back as bad values."""
    uri = str(tmp_path / "table")
    target = DeltaTarget(DeltaSettings(table_uri=uri, group_id="g", retry=FAST))
    target.merge(_files(tmp_path / "a", [[(k, {"amount": k, "ratio": 0.5}) for k in range(5)]]))
    dirty = _files(tmp_path / "b", [[(0, {"amount": 12, "ratio": 1.5}), (1, {"amount": "n/a", "ratio": 2.5}),
                                     (2, {"amount": 7, "ratio": "9007199254740993"}), (3, {"amount": None})]],
                   start=5)
    handed: list = []
    details, _ = target.merge(dirty, on_bad_values=handed.extend)

    assert [(b.offset, b.column, b.value) for b in handed] == [(6, "amount", "n/a"), (7, "ratio", "9007199254740993")]
    assert "topic=orders partition=0 offset=6: column 'amount' holds 'n/a'" in handed[0].describe()
    assert details["bad_values"] == 2
    rows = _table_rows(uri)
    assert rows[0] == {"id": 0, "_offset": 5, "_deleted": False, "amount": 12, "ratio": 1.5}
    assert rows[1]["_offset"] == 1 and rows[2]["_offset"] == 2, "the bad records' keys keep their earlier rows"
    assert rows[3] == {"id": 3, "_offset": 8, "_deleted": False}
    schema = pa.schema(DeltaTable(uri).schema().to_arrow())
    assert schema.field("amount").type == pa.int64() and schema.field("ratio").type == pa.float64()
    assert DeltaTable(uri).transaction_version("kafka-parquet-sink/g/orders/0") == 9


def test_without_a_policy_for_bad_values_the_file_is_refused_whole(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    target = DeltaTarget(DeltaSettings(table_uri=uri, group_id="g", retry=FAST))
    target.merge(_files(tmp_path / "a", [[(0, {"amount": 1})]]))
    with pytest.raises(DeltaRefusal, match="'amount'"):
        target.merge(_files(tmp_path / "b", [[(1, {"amount": "n/a"}), (2, {"amount": 3})]], start=1))
