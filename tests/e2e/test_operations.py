"""Operating several services on one host, and what an operator sees before the first commit."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from devkit.kafka_data import Workload, create_topics, end_offsets, produce_orders
from devkit.service_process import wait_until
from local_ems.server import LocalEmsServer
from tests.e2e.checks import all_committed, metric_total, scrape_metrics, table_matches
from tests.e2e.conftest import AUTHORIZATION

pytestmark = pytest.mark.e2e
# What Spark, its JVM and PySpark leave in a temp directory (names they choose; other processes
# on the machine may create other files there meanwhile).
LEAK_PREFIXES = ("spark-", "liblz4-java", "blockmgr-", "snappy-")
OUTAGE_S = 20  # shorter than the retry budget the outage test sets, so no upload gives up
RETRY_BUDGET_S = OUTAGE_S + 10  # the outage ends inside the uploads' retry budget


def test_two_services_sharing_a_scratch_directory_do_not_disturb_each_other(
        bootstrap, ems, unique, service_env, services, tmp_path):
    shared = str(tmp_path / "shared-scratch")  # as two services on the default directory would
    first, second = unique("host-a"), unique("host-b")
    create_topics(bootstrap, {first: 2, second: 2})
    workload = Workload()
    service_a = services(service_env(first, unique("group"), SINK_SCRATCH_DIR=shared, SINK_FLUSH_RECORDS=500))
    for burst in range(6):  # records keep flowing to both while the second one starts
        produce_orders(bootstrap, first, keys=300, updates=1, workload=workload, seed=burst, key_prefix=f"a{burst}")
        produce_orders(bootstrap, second, keys=300, updates=1, workload=workload, seed=burst, key_prefix=f"b{burst}")
        if burst == 2:
            service_b = services(service_env(second, unique("group"), SINK_SCRATCH_DIR=shared,
                                             SINK_FLUSH_RECORDS=500))
        time.sleep(1)
    for topic, service in ((first, service_a), (second, service_b)):
        wait_until(lambda t=topic: table_matches(ems, t, workload), 120, f"delivery of {topic}", process=service)
    assert service_a.terminate() == 0 and service_b.terminate() == 0
    for service in (service_a, service_b):
        assert "micro-batch failed" not in service.output(), service.output()[-3000:]
    assert f"scratch area {shared}/instance-0" in service_a.output()
    assert f"scratch area {shared}/instance-1" in service_b.output()


def test_lag_shows_from_the_start_while_the_endpoint_is_down(bootstrap, unique, service_env, services, tmp_path):
    down = LocalEmsServer(tmp_path / "ems-down", AUTHORIZATION)
    down.start()
    try:
        down.inject_fault(503)
        topic, group = unique("lag"), unique("group")
        create_topics(bootstrap, {topic: 3})
        produce_orders(bootstrap, topic, keys=3000, updates=3, workload=Workload())
        backlog = sum(end_offsets(bootstrap, topic, 3).values())
        env = service_env(topic, group, SINK_EMS_ENDPOINT=down.items_url(), SINK_UPLOAD_RETRY_BUDGET_MS=60000)
        port = int(env["SINK_HTTP_PORT"])
        started = time.monotonic()
        service = services(env)

        def lag_by_partition() -> dict[str, float]:
            try:
                samples = scrape_metrics(port)
            except Exception:
                return {}
            return {dict(labels)["partition"]: value for (name, labels), value in samples.items()
                    if name == "sink_consumer_lag_records" and dict(labels).get("topic") == topic}

        wait_until(lambda: sum(lag_by_partition().values()) == backlog and len(lag_by_partition()) == 3,
                   15, "lag series adding up to the backlog", process=service)
        assert time.monotonic() - started < 15
        assert metric_total(scrape_metrics(port), "sink_committed_offset", topic=topic) == 0
        assert not all_committed(bootstrap, group, topic, 3)
    finally:
        down.stop()


def test_starts_and_kills_leave_nothing_in_the_system_temp_directory(
        bootstrap, ems, unique, service_env, services, tmp_path):
    # TMPDIR is the system temp directory for Python; the JVM's default is /tmp whatever TMPDIR says.
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    jvm_temp = Path("/tmp")
    before = {p.name for p in jvm_temp.iterdir()}
    topic, group = unique("tmp"), unique("group")
    create_topics(bootstrap, {topic: 1})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=200, updates=1, workload=workload)
    env = {**service_env(topic, group, SINK_FLUSH_RECORDS=100), "TMPDIR": str(system_temp)}
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), 60, "commits", process=service)
    assert service.terminate() == 0
    produce_orders(bootstrap, topic, keys=200, updates=1, workload=workload, seed=2, key_prefix="again")
    service = services(env)
    wait_until(lambda: table_matches(ems, topic, workload), 60, "delivery", process=service)
    service.kill9()
    assert sorted(p.name for p in system_temp.iterdir()) == [], "temporary files outside SINK_SCRATCH_DIR"
    left = sorted(p.name for p in jvm_temp.iterdir() if p.name not in before and p.name.startswith(LEAK_PREFIXES))
    assert left == [], f"temporary files outside SINK_SCRATCH_DIR, in {jvm_temp}"


def test_an_outage_shows_within_seconds_and_so_does_recovery(bootstrap, unique, service_env, services, tmp_path):
    """A 20 s outage inside a 30 s retry budget: tasks keep retrying inside the executor all that
    time, so only the live signals can tell the driver."""
    endpoint = LocalEmsServer(tmp_path / "ems-outage", AUTHORIZATION)
    endpoint.start()
    try:
        topic, group = unique("live"), unique("group")
        create_topics(bootstrap, {topic: 2})
        env = service_env(topic, group, SINK_EMS_ENDPOINT=endpoint.items_url(), SINK_FLUSH_INTERVAL_MS=1000,
                          SINK_UPLOAD_RETRY_BUDGET_MS=int(RETRY_BUDGET_S * 1000))
        port = int(env["SINK_HTTP_PORT"])
        service = services(env)
        wait_until(lambda: (service.readiness(port) or (0,))[0] == 200, 60, "ready", process=service)

        endpoint.inject_fault(503)
        outage = time.monotonic()
        workload = Workload()
        produce_orders(bootstrap, topic, keys=200, updates=1, workload=workload)

        def signalled() -> bool:
            state = service.readiness(port)
            if state is None or state[0] != 503 or "retrying" not in state[1]["reason"]:
                return False
            samples = scrape_metrics(port)
            return (metric_total(samples, "sink_upload_retries_total") > 0
                    and metric_total(samples, "sink_upload_oldest_inflight_age_seconds") > 0)

        wait_until(signalled, 15, "readiness, retries and in-flight age showing the outage", interval_s=0.25,
                   process=service)
        shown_after = time.monotonic() - outage
        retries_then = metric_total(scrape_metrics(port), "sink_upload_retries_total")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - outage)))
        assert metric_total(scrape_metrics(port), "sink_upload_retries_total") > retries_then, "retries rising"

        endpoint.clear_faults()
        recovered = time.monotonic()
        # Ready again when an upload succeeds. The retry pending at recovery may wait a jittered backoff
        # of up to its upload's remaining budget (a fixed 15 s failed once on a loaded machine: a 20 s
        # wait). Its first attempt came before the outage showed, so that remainder is at most
        # RETRY_BUDGET_S - (recovered - outage - shown_after); then one attempt and a readiness poll.
        recovery_bound_s = RETRY_BUDGET_S - (recovered - outage - shown_after) + 5
        wait_until(lambda: (service.readiness(port) or (0,))[0] == 200, recovery_bound_s,
                   "ready again after the outage", interval_s=0.25, process=service)
        recovered_after = time.monotonic() - recovered
        wait_until(lambda: table_matches(endpoint, topic, workload), 60, "delivery", process=service)
        assert service.terminate() == 0
        assert shown_after < 15 and recovered_after < recovery_bound_s, (shown_after, recovered_after)
    finally:
        endpoint.stop()


def _jvm_running(service) -> bool:
    """A JVM in the service's session: Spark's start-up has launched it and not yet returned."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            pid, session = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[3])
            if session == service.pid and pid != service.pid and b"java" in (stat.parent / "cmdline").read_bytes():
                return True
    return False


STARTING_MOMENTS = {
    "first log line": lambda service: "starting kafka-parquet-sink" in service.output(),
    "HTTP up": lambda service: "HTTP endpoints on port" in service.output(),
    # Inside the window where SIGTERM is ignored so that the JVM inherits it: the signal must be kept.
    "JVM starting": lambda service: _jvm_running(service) and "streaming query" not in service.output(),
}


@pytest.mark.parametrize("moment", list(STARTING_MOMENTS))
def test_sigterm_while_starting_is_a_clean_stop(bootstrap, unique, service_env, services, moment):
    # An orchestrator may stop a pod that has only just started (a rollout, a rescheduled node).
    # The service must take that as an orderly stop at any moment, not die of the signal.
    topic, group = unique("early-stop"), unique("group")
    create_topics(bootstrap, {topic: 1})
    service = services(service_env(topic, group))
    reached = STARTING_MOMENTS[moment]
    wait_until(lambda: reached(service), 60, moment, interval_s=0.01, process=service)
    code = service.terminate()
    assert code == 0, f"exit {code} after SIGTERM at {moment!r}\n" + service.output()[-3000:]
    assert "stop requested (SIGTERM)" in service.output()
