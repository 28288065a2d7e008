"""Time SINK_TRANSFORM_SQL per 20k decoded rows: DuckDB in the task vs. a second Spark stage.

    .venv/bin/python scripts/measure_transform.py [--rounds 15]

Decodes 20,000 order records (the demo's shape) with the service's own decode, then times the same
rename + filter + cast statement three ways over the resulting Arrow table:
- `duckdb`: `Transform.apply`, what the task runs (warm: the connection is reused per worker);
- `spark.sql + toArrow`: the rows handed to Spark (createDataFrame from Arrow), `spark.sql`, back as Arrow;
- `spark.sql + Arrow writer`: the same, but the result goes back to Python workers as Arrow batches
  (a Python data source's `DataSourceArrowWriter`), where files would be written and uploaded, as a
  second stage inside the query would. (`mapInArrow` would do the same but needs pandas.)
Prints the median and minimum of each; the machine is shared, so compare ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sink_service.config import load_config, transform_for
from sink_service.decode import RAW_SCHEMA, DecodeSpec, decode

ROWS = 20_000
SQL = ("SELECT id AS order_id, CAST(amount AS DECIMAL(10,2)) AS amount, status, version "
       "FROM records WHERE status <> 'NEW'")


def raw_records(n: int) -> pa.RecordBatch:
    rng = random.Random(7)
    statuses = ("NEW", "PAID", "PACKED", "SHIPPED", "DELIVERED")
    values = [json.dumps({"id": f"order-{i}", "version": i % 5, "status": statuses[i % 5],
                          "amount": round(rng.uniform(1, 500), 2), "customer": f"customer-{rng.randrange(1000)}",
                          "note": "x" * rng.randrange(0, 40)}).encode() for i in range(n)]
    return pa.RecordBatch.from_arrays([
        pa.array(["orders"] * n), pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
        pa.array([1_700_000_000_000] * n, pa.int64()), pa.array([f"order-{i}".encode() for i in range(n)]),
        pa.array(values, pa.binary()), pa.nulls(n, RAW_SCHEMA.field("headers").type)], schema=RAW_SCHEMA)


def timed(label: str, run: Callable[[], int], rounds: int) -> None:
    first = time.perf_counter()
    rows = run()
    first = time.perf_counter() - first
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    print(f"{label:<28} median {statistics.median(times) * 1000:8.1f} ms   min {min(times) * 1000:8.1f} ms   "
          f"first {first * 1000:8.1f} ms   rows out {rows}")


class _CountingWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        sum(batch.num_rows for batch in iterator)
        return WriterCommitMessage()


class _CountingSource(DataSource):
    """Receives the statement's rows in Python workers, as the file writer would."""

    @classmethod
    def name(cls) -> str:
        return "transform_rows_counted"

    def writer(self, schema, overwrite: bool) -> _CountingWriter:
        return _CountingWriter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="measure-transform-")
    config = load_config({"SINK_KAFKA_BOOTSTRAP_SERVERS": "unused:9092", "SINK_TOPICS": "orders",
                          "SINK_TARGET": "dir", "SINK_DIR_PATH": scratch, "SINK_SCRATCH_DIR": scratch,
                          "SINK_PRIMARY_KEYS": "order_id", "SINK_TRANSFORM_SQL": SQL, "SINK_SPARK_MASTER": "local[2]"})
    transform = transform_for(config)
    raw = raw_records(ROWS)
    spec = DecodeSpec(None, ("id",), "_offset")
    [rows] = decode(raw, spec).segments
    print(f"{ROWS} records, decoded to {rows.num_columns} columns; statement: {SQL}")
    timed("decode (reference)", lambda: decode(raw, spec).segments[0].num_rows, args.rounds)
    timed("duckdb (in the task)", lambda: transform.apply(rows).num_rows, args.rounds)

    from sink_service.startup.spark_session import start_spark

    started = time.perf_counter()
    spark = start_spark(config)
    print(f"Spark session ({config.spark_master}) started in {time.perf_counter() - started:.1f} s")
    try:
        def spark_sql() -> pa.Table:
            spark.createDataFrame(rows).createOrReplaceTempView("records")
            return spark.sql(SQL + "").toArrow()

        spark.dataSource.register(_CountingSource)

        def spark_to_python_workers() -> int:
            spark.createDataFrame(rows).createOrReplaceTempView("records")
            spark.sql(SQL).write.format(_CountingSource.name()).mode("append").save()
            return -1  # counted in the workers

        timed("spark.sql + toArrow", lambda: spark_sql().num_rows, args.rounds)
        timed("spark.sql + Arrow writer", spark_to_python_workers, args.rounds)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
