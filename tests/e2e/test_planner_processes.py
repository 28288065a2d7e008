"""Spark's data-source planning processes end once a query has planned, and start again for the next query."""

from __future__ import annotations

import psutil
import pytest

from devkit.kafka_data import Workload, add_partitions, create_topics, produce_orders
from devkit.service_process import ServiceProcess, wait_until
from tests.e2e.checks import all_committed, table_matches

pytestmark = pytest.mark.e2e


def _planning_processes(service: ServiceProcess) -> list[str]:
    """The command lines of the service's data-source planning processes (daemons and workers)."""
    found = []
    for process in psutil.Process(service.pid).children(recursive=True):
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if "pyspark.sql.worker." in command:
            found.append(command)
    return found


def test_planning_processes_end_after_the_first_batch_and_a_restarted_query_plans_again(
        bootstrap, ems, unique, service_env, services):
    topic, group = unique("planners"), unique("group")
    create_topics(bootstrap, {topic: 1})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=200, updates=2, workload=workload)
    service = services(service_env(topic, group, SINK_TOPIC_REFRESH_INTERVAL_MS=1000))
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), 120, "the first commits", process=service)
    # Spark would keep them: the workers for a minute, their daemons (~35 MB each) for the whole run.
    wait_until(lambda: _planning_processes(service) == [], 10, "no planning process left", process=service)

    # A partition added while running restarts the query on the new assignment: Spark starts the
    # planning steps' daemons again, the new query plans and delivers, and they end again.
    add_partitions(bootstrap, topic, 2)
    produce_orders(bootstrap, topic, keys=50, updates=1, workload=workload, partition=1, key_prefix="late")
    wait_until(lambda: table_matches(ems, topic, workload) and all_committed(bootstrap, group, topic, 2), 120,
               "delivery by the restarted query", process=service)
    assert "streaming query" in service.output() and service.output().count("starting query at") >= 2
    wait_until(lambda: _planning_processes(service) == [], 10, "no planning process left after the restart",
               process=service)
    assert service.terminate() == 0
