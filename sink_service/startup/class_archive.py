"""The training workload whose classes the JVM class archive holds (`spark_home.build_archive`).

Kept apart from `spark_home`, which the driver imports before it launches the JVM: this needs
pyarrow and PySpark's data source classes, which are not on that path.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from sink_service.startup.spark_home import ARCHIVE_NAME, OFF, QUIET_CDS_LOGS, link_home, prepared_dir


class _TrainingPartition(InputPartition):
    pass


class _TrainingReader(DataSourceStreamReader):
    """Two tiny micro-batches through the same Python data source paths the service uses."""

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict, limit) -> dict:
        return {"batch": min(start["batch"] + 1, 2)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [_TrainingPartition(i) for i in range(2)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pydict({"value": [1]}, schema=pa.schema([("value", pa.int64())]))

    def commit(self, end: dict) -> None:
        pass


class TrainingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sink_class_archive_training"

    def schema(self) -> str:
        return "value bigint"

    def streamReader(self, schema) -> _TrainingReader:
        return _TrainingReader()


def build_archive(target: Path) -> None:
    """Run the training workload in a JVM that writes the archive at exit, then publish it."""
    from pyspark import SparkContext

    from sink_service.config import SinkConfig
    from sink_service.startup.spark_session import start_spark

    with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
        partial = Path(scratch) / target.name
        config = SinkConfig(scratch_dir=scratch, spark_class_archive=OFF)
        started = time.monotonic()
        spark = start_spark(config, extra_java_options=[f"-XX:ArchiveClassesAtExit={partial}", *QUIET_CDS_LOGS])
        spark.dataSource.register(TrainingSource)
        batches: list[int] = []
        query = (
            spark.readStream.format(TrainingSource.name()).load()
            .writeStream.foreachBatch(lambda df, batch_id: batches.append(len(df.collect())))
            .trigger(processingTime="100 milliseconds")
            .option("checkpointLocation", str(Path(scratch) / "checkpoint"))
            .start()
        )
        while len(batches) < 2 and query.isActive:
            time.sleep(0.1)
        query.stop()
        spark.stop()
        # The JVM writes the archive when it exits, which it does once its stdin closes.
        process = getattr(SparkContext._gateway, "proc", None)
        if process is None:
            raise RuntimeError("cannot find the Spark JVM process to wait for its archive")
        process.stdin.close()
        process.wait(timeout=120)
        if not partial.is_file():
            raise RuntimeError(f"the JVM did not write a class archive to {partial}")
        os.replace(partial, target)  # atomic: a starting service sees no archive or a whole one
    print(f"JVM class archive: {target} ({target.stat().st_size / 1e6:.0f} MB, "
          f"built in {time.monotonic() - started:.1f}s)")


def main(argv: list[str]) -> int:
    """`python -m sink_service.spark_home [--force]`: prepare the home and build the archive."""
    directory = prepared_dir()
    link_home(directory / "home")
    archive = directory / ARCHIVE_NAME
    if archive.is_file() and "--force" not in argv:
        print(f"Spark home and JVM class archive: {directory} (up to date)")
        return 0
    logging.basicConfig(level=logging.WARNING)
    build_archive(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
