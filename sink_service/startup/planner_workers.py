"""End Spark's data-source planning processes once a query has planned: ~180 MB idle for the whole run.

A query over a Python data source is planned in Python processes that Spark starts through one
daemon per planning step (`pyspark.sql.worker.create_data_source`, `plan_data_source_read`): each
step leaves its daemon (~35 MB) and a worker (~40-75 MB, it imported the source) in Spark's worker
pool. The query uses neither again after its first micro-batch was planned; Spark ends the idle
workers only after a minute and keeps the daemons for good. On a backlog that minute holds the
service's peak (1M records are drained in ~15 s), and in a live run the daemons stay.

So once each query has planned its first batch, the planning daemons are stopped with their
workers (the tasks run in `pyspark.worker` processes, the planner in
`python_streaming_source_runner`, neither touched here). The read is planned once per query, when
its first micro-batch builds its RDD, before Spark submits that batch's job: a job in the query's
job group (Spark's streaming thread names the group after the run id) therefore means the query
has planned, and so does a reported progress (a batch too short for a poll to see its job). Waiting
for the progress instead left the planning processes beside the task workers for the whole first
batch, where the 1M backlog's peak was (10 processes; 971 MB). A query started later (after a
rebalance) has Spark start them again, which costs that start ~0.2 s per step.

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
    """Stops the planning daemons once each streaming query has planned its first micro-batch.

    A query plans before its first batch's job starts (and so before its first progress); the
    service starts the next query only after stopping this one, so a query still active with a
    job or a progress is not planning, and neither is anything else. Polled, not a query listener:
    a Python listener's events pass through Spark Connect's protobuf classes, which this Spark's
    classpath lacks (the listener thread dies and stops the SparkContext). A poll is a few calls
    into the JVM."""

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
            if run_id in self._done or not self._planned(query, run_id):
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


    def _planned(self, query: object, run_id: str) -> bool:
        """Whether the query's first batch has its job (or is done): its read is planned by then."""
        if query.lastProgress() is not None:
            return True
        return bool(self._spark.sparkContext.statusTracker().getJobIdsForGroup(run_id))


def release_after_planning(spark: SparkSession) -> PlannerReleaser:
    """Start the thread that ends the planning processes after each query's first progress."""
    releaser = PlannerReleaser(spark)
    releaser.start()
    return releaser
