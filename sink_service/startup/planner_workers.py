"""End Spark's data-source planning processes once a query has planned: ~180 MB idle for the whole run.

A query over a Python data source is planned in Python processes that Spark starts through one
daemon per planning step (`pyspark.sql.worker.create_data_source`, `plan_data_source_read`): each
step leaves its daemon (~35 MB) and a worker (~40-75 MB, it imported the source) in Spark's worker
pool. The query uses neither again after its first micro-batch was planned; Spark ends the idle
workers only after a minute and keeps the daemons for good. On a backlog that minute holds the
service's peak (1M records are drained in ~15 s), and in a live run the daemons stay.

So once each query has reported its first progress (its plan is made by then; the tasks of the next batch
run in `pyspark.worker` processes, the planner in `python_streaming_source_runner`, neither
touched here), the planning daemons are stopped with their workers. A query started later (after
a rebalance) has Spark start them again, which costs that start ~0.2 s per step.

Spark keeps its worker factories in a private field of `SparkEnv`: where that changed, the
processes simply stay as before.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from py4j.protocol import Py4JError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PLANNER_MODULE_PREFIX = "pyspark.sql.worker."  # planning steps only: not pyspark.worker (tasks)
POLL_INTERVAL_S = 0.5


def stop_planner_daemons(spark: SparkSession) -> list[str]:
    """Stop the daemons (and their pooled workers) of every data-source planning step; their modules.

    Spark starts a stopped daemon again when the step runs again (a new query)."""
    # No method of SparkEnv is called through py4j: py4j lists a class's methods first, and some of
    # SparkEnv's name Spark Connect's protobuf classes, which are not on this classpath.
    env = spark._jsc.sc().env()
    field = spark._jvm.java.lang.Class.forName("org.apache.spark.SparkEnv").getDeclaredField("pythonWorkers")
    field.setAccessible(True)
    entries = field.get(env).clone().iterator()  # a copy: task workers may be added meanwhile
    stopped = []
    while entries.hasNext():
        entry = entries.next()
        module, factory = entry._1().workerModule(), entry._2()
        if module.startswith(PLANNER_MODULE_PREFIX) and factory.useDaemonEnabled():
            factory.stop()
            stopped.append(module)
    return sorted(stopped)


class PlannerReleaser(threading.Thread):
    """Stops the planning daemons once each streaming query has reported its first progress.

    A query plans before its first progress (its first micro-batch); the service starts the next
    query only after stopping this one, so a query still active with progress is not planning,
    and neither is anything else. Polled, not a query listener: a Python listener's events pass
    through Spark Connect's protobuf classes, which this Spark's classpath lacks (the listener
    thread dies and stops the SparkContext). A poll is three calls into the JVM."""

    def __init__(self, spark: SparkSession, interval_s: float = POLL_INTERVAL_S):
        super().__init__(name="planner-release", daemon=True)
        self._spark = spark
        self._interval_s = interval_s
        self._done: set[str] = set()  # run ids of the queries already seen with progress
        self.releases = 0  # how many times the daemons were stopped, for tests

    def run(self) -> None:
        streams = self._spark._jsparkSession.streams()
        while True:
            time.sleep(self._interval_s)
            try:
                self._poll(streams)
            except Py4JError as error:  # the session stopped (shutdown), or Spark changed
                log.debug("planner release stops: %s", type(error).__name__)
                return

    def _poll(self, streams: object) -> None:
        for query in streams.active():
            run_id = query.runId().toString()
            if run_id in self._done or query.lastProgress() is None:
                continue
            self._done.add(run_id)
            try:
                stopped = stop_planner_daemons(self._spark)
            except Py4JError as error:
                log.info("Spark's data-source planning processes stay until Spark ends them (%s)",
                         type(error).__name__)
                raise
            log.debug("stopped Spark's data-source planning daemons: %s", stopped)
            self.releases += 1


def release_after_planning(spark: SparkSession) -> PlannerReleaser:
    """Start the thread that ends the planning processes after each query's first progress."""
    releaser = PlannerReleaser(spark)
    releaser.start()
    return releaser
