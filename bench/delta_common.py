"""Shared pieces of the Delta benchmarks: rows shaped like the service's files, micro-batch files, the log.

The rows have the columns a file of the benchmark workload has after decoding (`id`, `version`, `status`,
`amount`, `customer`, `note`) plus the default metadata columns (`_key`, `_topic`, `_partition`, `_offset`,
`_timestamp`). A key `k` lives in Kafka partition `k % partitions`, as keyed producing puts every key in one
partition; offsets grow per partition, so `_offset` is the order column (the service's default).
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from uploader.delta import DeltaFile, applied_files
from uploader.target import FileMetadata

TOPIC = "bench"
PRIMARY_KEYS = ("id",)
ORDER = "_offset"
NOTE = "x" * 40  # the workload's 130-byte values carry ~40 bytes of padding
STATUSES = np.array(["new", "paid", "packed", "shipped", "done"])


def rows(ids: np.ndarray, *, partitions: int, offsets: np.ndarray, version: int, seed: int) -> pa.Table:
    """One row per id, shaped like a decoded file of the benchmark workload."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    key = pa.array(np.char.add("k", np.char.zfill(ids.astype(str), 9)))
    return pa.table({
        "_key": key,
        "_topic": pa.array(np.full(n, TOPIC)),
        "_partition": pa.array((ids % partitions).astype(np.int32)),
        "_offset": pa.array(offsets.astype(np.int64)),
        "_timestamp": pa.array(np.full(n, int(time.time() * 1000)), pa.timestamp("ms")),
        "id": key,
        "version": pa.array(np.full(n, version, np.int64)),
        "status": pa.array(STATUSES[rng.integers(0, 5, n)]),
        "amount": pa.array(rng.integers(100, 50_000, n) / 100.0),
        "customer": pa.array(np.char.add("c", np.char.zfill(rng.integers(0, 10_000, n).astype(str), 4))),
        "note": pa.array(np.full(n, NOTE)),
    })


def table_batches(keys: int, partitions: int, chunk: int = 500_000) -> Iterator[pa.RecordBatch]:
    """The base table, `chunk` keys at a time (bounded memory for 10M keys); key k at offset k // partitions."""
    for start in range(0, keys, chunk):
        ids = np.arange(start, min(keys, start + chunk), dtype=np.int64)
        yield from rows(ids, partitions=partitions, offsets=ids // partitions, version=0, seed=start).to_batches()


def schema() -> pa.Schema:
    return rows(np.arange(1, dtype=np.int64), partitions=1, offsets=np.zeros(1), version=0, seed=0).schema


def micro_batch(directory: Path, *, keys: int, partitions: int, files: int, rows_per_file: int,
                update_share: float, batch: int, seed: int) -> list[DeltaFile]:
    """`files` Parquet files, one per Kafka partition (0 .. files-1), as one micro-batch of the service closes;
    as `uploader.delta.DeltaFile`s, what `DeltaTarget.merge` takes.

    Each file holds `rows_per_file` rows of its partition: `update_share` of them existing keys picked at random
    (spread over the whole table), the rest new keys above the table's. Offsets continue after the table's
    (key k was written at offset k // partitions) and after earlier micro-batches (`batch` counts from 0).
    """
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    updates = int(rows_per_file * update_share)
    inserts = rows_per_file - updates
    per_partition_existing = keys // partitions
    for p in range(files):
        existing = rng.choice(per_partition_existing, size=updates, replace=False) * partitions + p
        fresh_base = keys + batch * inserts * partitions  # new ids of this batch: above the table and earlier batches
        fresh = fresh_base + np.arange(inserts, dtype=np.int64) * partitions + p
        ids = rng.permutation(np.concatenate([existing, fresh]).astype(np.int64))
        first = per_partition_existing + 1 + batch * rows_per_file
        offsets = np.arange(first, first + rows_per_file, dtype=np.int64)
        table = rows(ids, partitions=partitions, offsets=offsets, version=batch + 1, seed=seed * 100 + p)
        path = directory / f"{TOPIC}-{p}-{batch}.parquet"
        pq.write_table(table, path, compression="snappy")
        out.append(DeltaFile(path, FileMetadata(
            topic=TOPIC, partition=p, first_offset=int(first), last_offset=int(first + rows_per_file - 1),
            record_count=rows_per_file, target_table="bench", primary_keys=PRIMARY_KEYS, order_column=ORDER,
            schema_fingerprint="bench")))
    return out


def log_actions(table_dir: Path, after_version: int) -> list[dict]:
    """Per commit after `after_version` (local tables): files and bytes added and removed, from the JSON log,
    and the Kafka files it applied (`files`: their names; a merge of a micro-batch applies several)."""
    out = []
    log_dir = table_dir / "_delta_log"
    version = after_version + 1
    while (entry := log_dir / f"{version:020d}.json").exists():
        added = removed = added_bytes = removed_bytes = 0
        info: dict = {}
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                added += 1
                added_bytes += int(action["add"].get("size") or 0)
            elif "remove" in action:
                removed += 1
                removed_bytes += int(action["remove"].get("size") or 0)
            elif "commitInfo" in action:
                info = action["commitInfo"]
        out.append({"version": version, "files_added": added, "files_removed": removed, "bytes_added": added_bytes,
                    "bytes_removed": removed_bytes, "timestamp_ms": info.get("timestamp"),
                    "operation": info.get("operation"),
                    "files": [f["file"] for f in applied_files(info)]})
        version += 1
    return out


def table_files(table_dir: Path) -> tuple[int, int]:
    """(data files, bytes) in the table's current snapshot."""
    from deltalake import DeltaTable

    actions = DeltaTable(str(table_dir)).get_add_actions(flatten=True)
    sizes = actions.column("size_bytes").to_pylist() if actions.num_rows else []
    return len(sizes), int(sum(sizes))


def max_rss_mb() -> float:
    """This process's peak RSS so far (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

