"""A JVM class-data archive (AppCDS) that makes the Spark driver start faster.

Starting Spark loads some 20,000 classes from jars, parses and verifies them, mostly on one
thread. A dynamic class-data archive holds them already parsed and verified; the JVM maps it
instead. Measured here: `SparkSession.getOrCreate` 5.8 s -> 3.3 s, and each later first-time
step (registering the data source, planning the first batch) gets faster too.

The archive is built once per installation by a short training run of the same code paths the
service uses (`python -m sink_service.jvm_class_archive`; `scripts/bootstrap.sh` and the
Dockerfile run it). It is only an accelerator: when it is missing, or was built for another JVM
or another Spark, the service starts as before, just slower.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

log = logging.getLogger(__name__)

AUTO = "auto"
OFF = "off"
# Skipped classes (signed jars, generated accessors) are expected; they are loaded as usual.
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def _installation_key() -> str:
    """Changes whenever the JVM or the Spark jars change, which would invalidate an archive."""
    import pyspark

    java = shutil.which("java") or ""
    java_home = os.environ.get("JAVA_HOME", "")
    real_java = os.path.realpath(os.path.join(java_home, "bin", "java") if java_home else java)
    jars = Path(pyspark.__file__).parent / "jars"
    stamp = f"{real_java}|{_mtime(real_java)}|{pyspark.__version__}|{jars}|{_mtime(jars)}"
    return hashlib.sha256(stamp.encode()).hexdigest()[:12]


def _mtime(path: str | Path) -> int:
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0


def default_path() -> Path:
    """Inside the installation (the virtualenv), so it is built and removed together with it."""
    return Path(sys.prefix) / "share" / "kafka-parquet-sink" / f"spark-classes-{_installation_key()}.jsa"


def resolve(setting: str) -> Path | None:
    """The archive named by `SINK_SPARK_CLASS_ARCHIVE`: `auto`, a path, or `off`."""
    if setting in ("", OFF):
        return None
    return default_path() if setting == AUTO else Path(setting)


def java_options(setting: str) -> list[str]:
    """JVM options that use the archive, or none when there is no usable one."""
    path = resolve(setting)
    if path is None:
        return []
    if not path.is_file():
        log.info("no JVM class archive at %s: Spark starts without it (build it with "
                 "`python -m sink_service.jvm_class_archive`)", path)
        return []
    # -Xshare:auto: an archive from another JVM build is ignored rather than fatal.
    return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", *_QUIET]


# --- building -------------------------------------------------------------------------------------
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


class _TrainingSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sink_class_archive_training"

    def schema(self) -> str:
        return "value bigint"

    def streamReader(self, schema) -> _TrainingReader:
        return _TrainingReader()


def build(target: Path) -> None:
    """Run the training workload in a JVM that writes the archive at exit, then publish it."""
    from pyspark import SparkContext

    from sink_service.config import SinkConfig
    from sink_service.pipeline import start_spark

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
        partial = Path(scratch) / target.name
        config = SinkConfig(scratch_dir=scratch, spark_class_archive=OFF)
        started = time.monotonic()
        spark = start_spark(config, extra_java_options=[f"-XX:ArchiveClassesAtExit={partial}", *_QUIET])
        spark.dataSource.register(_TrainingSource)
        batches: list[int] = []
        query = (
            spark.readStream.format(_TrainingSource.name()).load()
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
        gateway = SparkContext._gateway
        process = getattr(gateway, "proc", None)
        if process is None:
            raise RuntimeError("cannot find the Spark JVM process to wait for its archive")
        process.stdin.close()
        process.wait(timeout=120)
        if not partial.is_file():
            raise RuntimeError(f"the JVM did not write a class archive to {partial}")
        os.replace(partial, target)  # atomic: a starting service sees no archive or a whole one
    size_mb = target.stat().st_size / 1e6
    print(f"JVM class archive: {target} ({size_mb:.0f} MB, built in {time.monotonic() - started:.1f}s)")


def main(argv: list[str]) -> int:
    """`python -m sink_service.jvm_class_archive [PATH] [--force]`: build unless it exists."""
    paths = [a for a in argv if not a.startswith("--")]
    target = Path(paths[0]) if paths else default_path()
    if target.is_file() and "--force" not in argv:
        print(f"JVM class archive: {target} (up to date)")
        return 0
    logging.basicConfig(level=logging.WARNING)
    build(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
