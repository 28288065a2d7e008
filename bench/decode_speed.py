"""Decode throughput of `sink_service.decode.decode` on typical chunks (no Kafka, no Spark).

    .venv/bin/python -m bench.decode_speed

Chunks: 20,000 flat order events of 130 B as `bench/workload.py` produces them, 20,000 nested ones
(struct, list of structs, list of strings), and 20,000 flat ones carrying an ISO-8601 timestamp
field. Prints the best of several runs per chunk, in ms and MB/s of JSON values.
"""

from __future__ import annotations

import time

import pyarrow as pa

from bench.workload import WorkloadSpec, build_records
from sink_service.decode import RAW_SCHEMA, DecodeSpec, decode

RECORDS = 20_000
RUNS = 25


def _raw(values: list[bytes], keys: list[bytes] | None = None) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays([
        pa.array(["orders"] * n, pa.string()),
        pa.array([0] * n, pa.int32()),
        pa.array(range(n), pa.int64()),
        pa.array([1_700_000_000_000 + i for i in range(n)], pa.int64()),
        pa.array(keys or [None] * n, pa.binary()),
        pa.array(values, pa.binary()),
        pa.nulls(n, RAW_SCHEMA.field("headers").type),
    ], schema=RAW_SCHEMA)


def flat() -> pa.RecordBatch:
    keys, values = build_records(WorkloadSpec(records=RECORDS, partitions=1, keys=RECORDS, record_size=130))
    return _raw(values, keys)


def nested() -> pa.RecordBatch:
    template = ('{"id":"k%07d","version":%d,"customer":{"id":"c%04d","name":"Ann","address":'
                '{"city":"Lyon","zip":"69001"}},"items":[{"sku":"s%03d","qty":%d,"price":%d.5},'
                '{"sku":"t%03d","qty":1,"price":3.25}],"tags":["new","web"]}')
    values = [(template % (i, i % 9, i % 10_000, i % 1000, i % 5 + 1, i % 90, i % 1000)).encode()
              for i in range(RECORDS)]
    return _raw(values)


def timestamps() -> pa.RecordBatch:
    template = '{"id":"k%07d","version":%d,"status":"PAID","amount":%d.25,"at":"2024-01-%02dT10:%02d:00+02:00"}'
    return _raw([(template % (i, i % 9, i % 500, i % 28 + 1, i % 60)).encode() for i in range(RECORDS)])


def best_ms(raw: pa.RecordBatch, spec: DecodeSpec) -> float:
    decode(raw, spec)  # warm-up
    best = float("inf")
    for _ in range(RUNS):
        started = time.perf_counter()
        decode(raw, spec)
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> None:
    spec = DecodeSpec(None, ("id",), "_offset")
    for name, build in (("flat", flat), ("nested", nested), ("timestamps", timestamps)):
        raw = build()
        ms = best_ms(raw, spec)
        mb = raw.column("value").nbytes / 1e6
        print(f"{name:<11} {raw.num_rows} records {mb:5.2f} MB  {ms:7.2f} ms  {mb / ms * 1000:6.0f} MB/s")


if __name__ == "__main__":
    main()
