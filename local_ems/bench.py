"""Upsert throughput of the local endpoint: push N rows as Parquet files of M rows over real HTTP.

    python -m local_ems.bench --rows 2000000 --file-rows 100000 [--workers 1] [--url http://...]

The files (order events: 4 versions per key, ordered by `_offset`) are encoded before the clock starts;
the clock covers the HTTP POSTs until the last 200, i.e. multipart parsing, Parquet decoding,
deduplication and the SQLite upsert. For scale it also times just decoding the same files.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import requests

from local_ems.client import LocalEmsClient
from local_ems.server import LocalEmsServer

AUTHORIZATION = "AppKey bench-key"
STATUSES = ("NEW", "PAID", "PACKED", "SHIPPED", "DELIVERED")


def order_files(rows: int, file_rows: int, versions: int = 4) -> list[bytes]:
    keys = max(1, rows // versions)
    files = []
    for first in range(0, rows, file_rows):
        offsets = pa.array(range(first, min(rows, first + file_rows)), pa.int64())
        n = len(offsets)
        key_numbers = [o % keys for o in range(first, first + n)]
        table = pa.table({
            "id": [f"order-{k}" for k in key_numbers],
            "version": [o // keys for o in range(first, first + n)],
            "status": [STATUSES[(o // keys) % len(STATUSES)] for o in range(first, first + n)],
            "amount": [round((o * 7919 % 50000) / 100, 2) for o in range(first, first + n)],
            "customer": [f"customer-{o % 1000}" for o in range(first, first + n)],
            "note": ["x" * (o % 40) for o in range(first, first + n)],
            "_offset": offsets,
        })
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="snappy")
        files.append(sink.getvalue())
    return files


def push_all(items_url: str, files: list[bytes], target: str, workers: int) -> float:
    params = {"targetName": target, "clientId": "bench", "primaryKeys": "id", "duplicateRemovalOrderColumn": "_offset"}

    def push(numbered: tuple[int, bytes]) -> None:
        number, data = numbered
        response = session.post(items_url, params=params, headers={"Authorization": AUTHORIZATION},
                                files={"file": (f"topic-bench_partition-0_file-{number}.parquet", data)}, timeout=600)
        response.raise_for_status()

    session = requests.Session()
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(push, enumerate(files)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--file-rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=1, help="concurrent uploads")
    parser.add_argument("--url", help="base URL of a running `python -m local_ems` (authorization "
                                      f"{AUTHORIZATION!r}); default: start one in-process")
    args = parser.parse_args()
    files = order_files(args.rows, args.file_rows)
    started = time.perf_counter()
    for data in files:
        pq.read_table(pa.BufferReader(data))
    decode_s = time.perf_counter() - started
    target = f"bench_{int(time.time())}"
    with tempfile.TemporaryDirectory() as data_dir:
        if args.url:
            client = LocalEmsClient(args.url)
            elapsed = push_all(client.items_url(), files, target, args.workers)
            count = client.count(target)
        else:
            with LocalEmsServer(data_dir, AUTHORIZATION) as server:
                elapsed = push_all(server.items_url(), files, target, args.workers)
                count = server.count(target)
    result = {
        "rows": args.rows, "files": len(files), "file_rows": args.file_rows, "workers": args.workers,
        "megabytes": round(sum(map(len, files)) / 1e6, 1), "seconds": round(elapsed, 2),
        "rows_per_s": round(args.rows / elapsed), "table_rows": count,
        "parquet_decode_rows_per_s": round(args.rows / decode_s),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
