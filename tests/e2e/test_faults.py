"""Faults: kill -9 mid-stream, an endpoint outage, errors retrying cannot fix, poison records.

The kill -9 and outage tests deliver to the last-upload endpoint (a later file replaces a key's row
whatever its order value): a partition's file that arrives after a newer one leaves older rows
behind and fails them unless a later upload re-sends the newer versions.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import wait_until
from tests.e2e.checks import (
    all_committed,
    assert_ranges_cover,
    assert_table_exact,
    duplicate_overhead,
    table_matches,
)

pytestmark = pytest.mark.e2e


def test_kill_minus_nine_twice_mid_stream_loses_nothing(bootstrap, ems_last_upload, unique, service_env, services):
    ems = ems_last_upload
    topic, group = unique("crash"), unique("group")
    create_topics(bootstrap, {topic: 3})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=6000, updates=5, workload=workload)
    env = service_env(topic, group, SINK_EMS_ENDPOINT=ems.items_url(), SINK_FLUSH_RECORDS=1000,
                      SINK_MAX_FILES_PER_BATCH=3, SINK_MAX_BATCH_RECORDS=3000)
    total = sum(end_offsets(bootstrap, topic, 3).values())

    def committed() -> int:
        return sum(committed_offsets(bootstrap, group, topic, 3).values())

    for crash in range(2):
        service = services(env)
        before = committed()
        wait_until(lambda b=before: committed() > b, 120, f"progress before crash {crash + 1}", process=service)
        service.kill9()
        assert committed() < total, "the workload finished before the crash; make it larger"

    service = services(env)
    wait_until(lambda: table_matches(ems, topic, workload), 240, "convergence after restarts", process=service)
    wait_until(lambda: all_committed(bootstrap, group, topic, 3), 60, "final commits", process=service)
    assert service.terminate() == 0
    assert_table_exact(ems, topic, workload)
    assert_ranges_cover(ems, topic, end_offsets(bootstrap, topic, 3), allow_replays=True)
    # A crash re-sends at most what was in flight: one micro-batch of 3 files per crash here.
    overhead = duplicate_overhead(ems, topic, end_offsets(bootstrap, topic, 3))
    assert overhead <= 1 + 2 * 3 * 1000 / total, f"{overhead:.3f} offsets uploaded per offset"


def test_endpoint_outage_commits_nothing_then_delivers_everything(bootstrap, ems_last_upload, unique, service_env,
                                                                  services):
    ems = ems_last_upload
    topic, group = unique("outage"), unique("group")
    create_topics(bootstrap, {topic: 3})
    env = service_env(topic, group, SINK_EMS_ENDPOINT=ems.items_url(), SINK_FLUSH_RECORDS=1000,
                      SINK_UPLOAD_RETRY_BUDGET_MS=3000, SINK_RESTART_BACKOFF_MAX_MS=4000)
    port = int(env["SINK_HTTP_PORT"])
    service = services(env)
    wait_until(lambda: (service.readiness(port) or (0,))[0] == 200, 120, "the service to be ready", process=service)

    # 503 for at least 20 s, and until readiness has reported it (a loaded machine is slow).
    ems.inject_fault(503)
    outage_started = time.monotonic()
    workload = Workload()
    produce_orders(bootstrap, topic, keys=2000, updates=3, workload=workload)
    seen_not_ready = False
    while time.monotonic() - outage_started < 20 or not seen_not_ready:
        assert time.monotonic() - outage_started < 120, "readiness never reported the failing uploads\n" + (
            service.output()[-3000:])
        assert committed_offsets(bootstrap, group, topic, 3) == {}, "committed during the outage"
        assert service.process.poll() is None, service.output()[-3000:]
        state = service.readiness(port)
        if state is not None and state[0] == 503 and not state[1]["last_batch_ok"]:
            seen_not_ready = True
        time.sleep(0.5)
    ems.clear_faults()
    wait_until(lambda: table_matches(ems, topic, workload), 180, "delivery after the outage", process=service)
    wait_until(lambda: all_committed(bootstrap, group, topic, 3), 60, "commits after the outage", process=service)
    wait_until(lambda: (service.readiness(port) or (0,))[0] == 200, 30, "ready again", process=service)
    assert service.terminate() == 0
    assert_table_exact(ems, topic, workload)
    assert "micro-batch failed; replaying from the committed offsets" in service.output()


def test_bad_credentials_stop_the_service_naming_the_setting(bootstrap, ems, unique, service_env, services):
    topic, group = unique("auth"), unique("group")
    create_topics(bootstrap, {topic: 1})
    produce_orders(bootstrap, topic, keys=10, updates=1, workload=Workload())
    wrong = "AppKey wrong-key-do-not-print"
    service = services(service_env(topic, group, SINK_EMS_AUTHORIZATION=wrong, SINK_FLUSH_INTERVAL_MS=500))
    code = service.wait(120)
    output = service.output()
    assert code == 3, output[-3000:]
    assert "SINK_EMS_AUTHORIZATION" in output
    assert "wrong-key-do-not-print" not in output
    assert committed_offsets(bootstrap, group, topic, 1) == {}
    requests_seen = [u for u in ems.uploads(topic)]
    assert requests_seen == []


def _produce_raw(bootstrap: str, topic: str, values: list[bytes | None]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for n, value in enumerate(values):
        producer.produce(topic, key=f"k{n}".encode(), value=value, partition=0)
    producer.flush(10)


def _poison_values() -> list[bytes | None]:
    good = [json.dumps({"id": f"ok-{n}", "version": n}).encode() for n in range(10)]
    return [*good[:4], b"{not json", json.dumps({"version": 1}).encode(), None, *good[4:]]


def test_poison_record_under_fail_stops_with_its_coordinates(bootstrap, ems, unique, service_env, services):
    topic, group = unique("poison"), unique("group")
    create_topics(bootstrap, {topic: 1})
    _produce_raw(bootstrap, topic, _poison_values())
    service = services(service_env(topic, group, SINK_FLUSH_INTERVAL_MS=500))
    code = service.wait(120)
    output = service.output()
    assert code == 3, output[-3000:]
    assert f"topic={topic} partition=0 offset=4" in output
    assert "SINK_ERROR_POLICY" in output
    # Everything before the poison record was delivered and committed; nothing after it.
    assert {r["id"] for r in ems.table(topic)} == {f"ok-{n}" for n in range(4)}
    assert committed_offsets(bootstrap, group, topic, 1) == {0: 4}


def test_poison_records_under_skip_are_logged_and_the_rest_delivered(bootstrap, ems, unique, service_env, services):
    topic, group = unique("skip"), unique("group")
    create_topics(bootstrap, {topic: 1})
    _produce_raw(bootstrap, topic, _poison_values())
    service = services(service_env(topic, group, SINK_FLUSH_INTERVAL_MS=500, SINK_ERROR_POLICY="skip"))
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), 120, "commit past the bad records",
               process=service)
    assert service.terminate() == 0
    output = service.output()
    assert {r["id"] for r in ems.table(topic)} == {f"ok-{n}" for n in range(10)}
    for offset, reason in ((4, "JSON"), (5, "primary key field `id` is missing"), (6, "tombstone")):
        line = next(line for line in output.splitlines() if f"offset={offset}:" in line and "skipped" in line)
        assert reason in line, line
