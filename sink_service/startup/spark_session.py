"""The driver's Spark session, started as early and as lean as the service allows.

The JVM takes seconds to start, mostly on one core, so the service starts it before importing the
pipeline (decoding, Parquet, upload, the source), which another thread imports meanwhile. This
module therefore imports nothing of the pipeline before the JVM is launched.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from py4j import protocol as py4j_protocol
from py4j.protocol import Py4JError
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession
from pyspark.sql import types as spark_types

from sink_service.startup import java_home, planner_workers, spark_home
from sink_service.startup.stop_signals import sigterm_ignored_by_children

if TYPE_CHECKING:
    from sink_service.config import SinkConfig

log = logging.getLogger(__name__)

LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
WORKER_ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "2", "ARROW_DEFAULT_MEMORY_POOL": "system",
                        "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
RETAINED_UI_ENTRIES = 20  # jobs, stages and SQL executions Spark's status store keeps (see below)
# The serial collector grows the heap to keep 40-70% of it free after a collection (its defaults):
# 105 MB committed for ~48 MB live at start-up. Kept 10-20% free, the heap stays near 70 MB and the
# JVM's RSS ~7-10 MB lower (live 20k/s: 299 against 306-309 MB; backlog 287 against 296-298), at
# the same JVM CPU.
HEAP_SHAPE = ("-XX:MinHeapFreeRatio=10", "-XX:MaxHeapFreeRatio=20")
DRIVER_HEAP = "512m"  # the driver JVM's heap cap: it plans and commits, records never enter it


def start_spark(config: SinkConfig, extra_java_options: Sequence[str] = ()) -> SparkSession:
    """The driver's session, with the Kafka range source registered."""
    java_home.resolve_java()  # JAVA_HOME of the Java installed from PyPI, where that is the one
    # Executors must run this interpreter, the one that has the project's dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if config.spark_master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The JVM and every Python worker inherit these (a value already set is kept). librdkafka's and
    # Arrow's threads each got a glibc arena of their own (up to 8 per core), which kept freed
    # pages apart from the ones the trim after a range hands back (task/heap_release.py); Arrow's
    # buffers come from glibc too instead of mimalloc, which held them between ranges. Measured on
    # the 1M backlog over 6 partitions: Python workers 667 -> 564 MB at the peak, CPU within noise.
    # Blocks of 1 MiB and more (fetch responses, Arrow buffers, Parquet pages) are mapped and
    # unmapped on their own: glibc's default threshold rises to the largest block freed (up to
    # 32 MiB), after which such blocks stay in the heap between ranges. With a fixed threshold a task
    # worker keeps ~160 instead of ~176 MB between backlog batches (1M backlog peak 965 -> 928 MB
    # with the heap settings below; CPU within noise).
    for name, value in WORKER_ALLOCATOR_ENV.items():
        os.environ.setdefault(name, value)
    # Records never enter the JVM, so it mostly schedules tasks: the C1 compiler and the serial
    # collector start faster and use less memory (about 1.5 s less start-up measured here).
    jvm_options = [f"-Dlog4j2.configurationFile=file:{LOG4J2_PROPERTIES}",
                   "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    # Temporary files (Spark's `spark-*` directories, the lz4 native library the JVM unpacks, the
    # Python side's files) go to the scratch area, which is cleared at the next start: in the
    # system temp directory they would pile up across restarts, even clean ones.
    temp = Path(config.scratch_dir) / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(temp)
    tempfile.tempdir = str(temp)
    # The prepared home and class archive are this machine's: a cluster's executors have their own.
    # Its live heap stays near 55 MB (GC log); the default heap (1/64 of the host's memory to start,
    # 1 GB at most) let the JVM alone reach 830 MB in one 4M-record drain. Small to start, capped at
    # DRIVER_HEAP: 413 -> 336 MB of JVM RSS on a 1M drain, and no run above the documented bound.
    driver_options = [*jvm_options, "-Xms64m", *HEAP_SHAPE, f"-Djava.io.tmpdir={temp}",
                      *spark_home.activate(config.spark_class_archive), *extra_java_options]
    settings = {
        "spark.master": config.spark_master,
        "spark.app.name": "kafka-parquet-sink",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.adaptive.enabled": "false",  # not used by streaming; avoids a warning per query
        "spark.python.worker.reuse": "true",
        # The plans carry one outcome row per range: generating and compiling Java code for them
        # cost the first micro-batch ~0.5 s of JVM time (Janino, five classes) and saved nothing.
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        "spark.sql.streaming.stopActiveRunOnRestart": "true",
        # Spark's status store keeps every job, stage, task and SQL execution up to these counts (1,000
        # jobs, stages and executions, 100,000 tasks by default) even with the UI off: each
        # micro-batch adds one of each, so the JVM's heap grew for hours until the cap. Nothing
        # reads them here (no UI, no status tracker); a few are kept for a heap dump's sake.
        "spark.ui.retainedJobs": str(RETAINED_UI_ENTRIES),
        "spark.ui.retainedStages": str(RETAINED_UI_ENTRIES),
        "spark.ui.retainedTasks": str(RETAINED_UI_ENTRIES * 10),
        "spark.sql.ui.retainedExecutions": str(RETAINED_UI_ENTRIES),
        # The checkpoint is scratch. Spark's default manager renames through Hadoop's FileContext,
        # which forks `readlink` for every file it writes (JVM CPU 8.2 -> 7.5 s in 65 s at 20k/s).
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
        # Nor does it need checksums: Hadoop's default local file system writes a .crc file beside
        # each checkpoint file, and without Hadoop's native library forks `chmod` for both.
        "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
        "spark.driver.memory": DRIVER_HEAP,
        "spark.driver.extraJavaOptions": " ".join(driver_options),
        "spark.executor.extraJavaOptions": " ".join(jvm_options),
        "spark.local.dir": str(Path(config.scratch_dir) / "spark-local"),
    }
    # Executors on other hosts do not inherit the driver's environment: Spark hands them these.
    settings.update({f"spark.executorEnv.{name}": value for name, value in WORKER_ALLOCATOR_ENV.items()})
    if not config.spark_master.startswith("local"):
        # Task specs carry upload credentials to executors: authenticate and encrypt Spark's RPC.
        settings.update({"spark.authenticate": "true", "spark.network.crypto.enabled": "true"})
    # The JVM inherits the ignored SIGTERM and keeps ignoring it, so a SIGTERM sent to the whole
    # process group cannot kill it before the service has drained and committed.
    _drop_numpy_converters()
    with sigterm_ignored_by_children():
        spark = _session(settings, config.spark_auth_secret)
    spark.sparkContext.setLogLevel(config.spark_log_level)
    _skip_static_source_lookup(spark)
    planner_workers.release_after_planning(spark)
    from sink_service.kafka_source.datasource import KafkaRangeDataSource

    spark.dataSource.register(KafkaRangeDataSource)
    return spark


def _drop_numpy_converters() -> None:
    """Keep pyarrow and numpy out of the driver: ~40 MB of its RSS that it has no use for.

    PySpark registers py4j converters for NumPy values, and py4j asks each of them about every
    argument of every call into the JVM. Asked the first time, they import `pyspark.testing.utils`
    to learn whether NumPy is installed, which imports pyarrow and numpy. The driver never hands the
    JVM a NumPy value (its tasks decode and write; it plans and commits), so the two go. Where
    PySpark renames them, they stay, and `tests/e2e/test_pipeline.py` says so.
    """
    numpy_converters = tuple(getattr(spark_types, name) for name in ("NumpyScalarConverter", "NumpyArrayConverter")
                             if hasattr(spark_types, name))
    if numpy_converters:
        py4j_protocol.INPUT_CONVERTER[:] = [
            c for c in py4j_protocol.INPUT_CONVERTER if not isinstance(c, numpy_converters)]


def _session(settings: dict[str, str], auth_secret: str | None) -> SparkSession:
    """The session; the RPC secret is handed to the running JVM, never put on a command line.

    PySpark starts the JVM through spark-submit with every setting as a `--conf k=v` argument, so
    a secret among them would show in `ps` for the shell, the launcher and the JVM: readable by any
    local user and every monitoring agent. The JVM is therefore launched first without it; the
    session's configuration is then built in that JVM over py4j, where the secret is added.
    (Spark's standalone driver only takes the secret from `spark.authenticate.secret`; its workers
    hand it to executors through their environment.) Spark redacts it wherever it prints settings.
    """
    if auth_secret:
        SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setAll(settings.items()))
        settings = {**settings, "spark.authenticate.secret": auth_secret}
    return SparkSession.builder.config(map=settings).getOrCreate()


def _skip_static_source_lookup(spark: SparkSession) -> None:
    """Spare the first data source registration Spark's search for pip-installed data sources.

    On the first Python data source call Spark starts a Python process that imports every module
    named `pyspark_*` on the path, to register their `DefaultSource`s. The service reads only its
    own registered source, and the search sat on the start-up path: a Python process (~0.3 s) and
    an idle worker with its daemon kept for the whole run. Telling Spark's data source manager that
    the search found nothing skips it. That manager is internal to Spark: where it changed, the
    search simply runs as before.
    """
    jvm = spark._jvm
    try:
        manager = getattr(getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$"), "MODULE$")
        if manager.dataSourceBuilders().isEmpty():
            nothing = getattr(getattr(jvm.scala.collection.immutable, "Map$"), "MODULE$").empty()
            getattr(manager, "dataSourceBuilders_$eq")(jvm.scala.Some(nothing))
    except Py4JError as error:
        log.info("Spark searches for pip-installed data sources at start-up (%s)", type(error).__name__)
