"""The training workload whose classes the JVM class archive holds (`spark_home.build_archive`).

Kept apart from `spark_home`, which the driver imports before it launches the JVM: this needs
pyarrow and PySpark's data source classes, which are not on that path.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


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
