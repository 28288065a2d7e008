"""In-file compaction (SINK_COMPACT_FILES): the latest row per key, the same end state, fewer rows."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.config import load_config
from sink_service.decode.compact import FileCompactor, compact, latest_rows


def upserted(rows: list[dict], keys: tuple[str, ...], order: str) -> dict[tuple, dict]:
    """What an upsert endpoint ends with: per key the highest order value (null lowest), ties to the later row."""
    best: dict[tuple, tuple[tuple, dict]] = {}
    for position, row in enumerate(rows):
        rank = (row[order] is not None, row[order] if row[order] is not None else 0, position)
        key = tuple(row[k] for k in keys)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, row)
    return {key: row for key, (_, row) in best.items()}


def update_heavy(records: int, keys: int, seed: int = 3) -> pa.Table:
    """Record i is a version of key i % keys, with out-of-order and tied `version`s."""
    rng = random.Random(seed)
    return pa.table({
        "id": [f"k{i % keys:05d}" for i in range(records)],
        "region": [("eu", "us")[i % keys % 2] for i in range(records)],
        "version": [rng.randrange(5) for _ in range(records)],
        "_offset": list(range(1000, 1000 + records)),
    })


def test_the_latest_row_of_each_key_is_kept_in_offset_order():
    table = pa.table({"id": ["a", "b", "a", "c", "b", "a"], "_offset": [10, 11, 12, 13, 14, 15]})
    assert compact(table, ("id",), "_offset").to_pylist() == [
        {"id": "c", "_offset": 13}, {"id": "b", "_offset": 14}, {"id": "a", "_offset": 15}]


def test_the_highest_order_value_wins_and_a_tie_goes_to_the_later_offset():
    table = pa.table({"id": ["a", "a", "a", "b", "b"], "version": [3, 9, 9, 2, 1], "_offset": [1, 2, 3, 4, 5]})
    assert compact(table, ("id",), "version").column("_offset").to_pylist() == [3, 4]


def test_a_null_order_value_loses_to_any_value():
    table = pa.table({"id": ["a", "a", "b"], "version": [1, None, None], "_offset": [1, 2, 3]})
    assert compact(table, ("id",), "version").column("_offset").to_pylist() == [1, 3]


def test_keys_of_several_columns_and_string_order_values():
    table = pa.table({"id": [1, 1, 1, 2], "region": ["eu", "us", "eu", "eu"],
                      "at": ["2024-05", "2024-01", "2023-12", "2024-02"], "_offset": [1, 2, 3, 4]})
    assert compact(table, ("id", "region"), "at").column("_offset").to_pylist() == [1, 2, 4]


def test_without_primary_keys_nothing_is_compacted():
    table = update_heavy(50, 5)
    assert compact(table, (), "_offset") is table


def test_a_table_without_updates_is_returned_as_it_is():
    table = pa.table({"id": ["a", "b", "c"], "_offset": [1, 2, 3]})
    assert compact(table, ("id",), "_offset") is table


@pytest.mark.parametrize("order", ["_offset", "version"])
def test_the_end_state_is_identical_with_fewer_rows(order):
    table = update_heavy(5000, 400)
    keys = ("id", "region")
    compacted = compact(table, keys, order)
    assert compacted.num_rows == 400
    assert upserted(compacted.to_pylist(), keys, order) == upserted(table.to_pylist(), keys, order)
    assert compacted.column("_offset").to_pylist() == sorted(compacted.column("_offset").to_pylist())


def test_latest_rows_over_a_chunked_table():
    table = pa.concat_tables([update_heavy(30, 7, seed=1), update_heavy(30, 7, seed=2)])
    assert table.column("version").num_chunks == 2
    rows = [{**row, "position": i} for i, row in enumerate(table.to_pylist())]
    expected = sorted(row["position"] for row in upserted(rows, ("id",), "version").values())
    assert latest_rows(table, ("id",), "version").to_pylist() == expected


def write_with(compactor: FileCompactor, path: Path, row_groups: list[pa.Table]) -> int:
    """Write a file as PartitionFileWriter does: row group by row group, then close and finish."""
    with pq.ParquetWriter(path, row_groups[0].schema, compression="snappy") as writer:
        for rows in row_groups:
            group = compactor.row_group(rows)
            writer.write_table(group, row_group_size=group.num_rows)
    return compactor.finish(path, "snappy")


def test_a_key_in_two_row_groups_of_a_file_survives_once(tmp_path):
    table = update_heavy(3000, 250)
    groups = [table.slice(0, 1000), table.slice(1000, 1000), table.slice(2000)]
    path = tmp_path / "f.parquet"
    rows = write_with(FileCompactor(("id",), "version"), path, groups)
    written = pq.read_table(path)
    assert rows == written.num_rows == 250
    assert written.equals(compact(table, ("id",), "version"))
    assert pq.ParquetFile(path).metadata.num_row_groups <= 3
    assert not list(tmp_path.glob("*.compacting"))


def test_a_file_of_one_row_group_is_not_rewritten(tmp_path):
    path = tmp_path / "f.parquet"
    rows = write_with(FileCompactor(("id",), "_offset"), path, [update_heavy(500, 50)])
    assert rows == pq.read_table(path).num_rows == 50
    before = path.stat()
    assert rows == 50 and (before.st_ino, before.st_mtime_ns) == (path.stat().st_ino, path.stat().st_mtime_ns)


def test_row_groups_with_distinct_keys_are_not_rewritten(tmp_path):
    path = tmp_path / "f.parquet"
    first = pa.table({"id": ["a", "b"], "_offset": [1, 2]})
    second = pa.table({"id": ["c", "d"], "_offset": [3, 4]})
    compactor = FileCompactor(("id",), "_offset")
    with pq.ParquetWriter(path, first.schema) as writer:
        for rows in (first, second):
            writer.write_table(compactor.row_group(rows))
    inode = path.stat().st_ino
    assert compactor.finish(path, None) == 4
    assert path.stat().st_ino == inode


def test_the_compactor_starts_afresh_after_finish_and_reset(tmp_path):
    compactor = FileCompactor(("id",), "_offset")
    compactor.row_group(pa.table({"id": ["a"], "_offset": [1]}))
    compactor.reset()  # the open file was abandoned
    one = tmp_path / "one.parquet"
    assert write_with(compactor, one, [pa.table({"id": ["a", "b"], "_offset": [2, 3]}),
                                       pa.table({"id": ["a"], "_offset": [4]})]) == 2
    two = tmp_path / "two.parquet"
    assert write_with(compactor, two, [pa.table({"id": ["a"], "_offset": [5]})]) == 1
    assert pq.read_table(one).column("_offset").to_pylist() == [3, 4]


def test_compaction_is_on_by_default():
    environ = {
        "SINK_KAFKA_BOOTSTRAP_SERVERS": "broker:9092", "SINK_TOPICS": "orders",
        "SINK_TARGET": "dir", "SINK_DIR_PATH": "/tmp/out",
    }
    assert load_config(environ).compact_files is True
    assert load_config({**environ, "SINK_COMPACT_FILES": "false"}).compact_files is False
