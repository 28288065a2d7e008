"""Crash chaos: twelve `kill -9` at random moments while records flow, the endpoint misbehaves and the
broker pauses once.

After every kill, no partition may be committed past what reached the endpoint without a gap.
The endpoint is the last-upload-wins kind, reached through a proxy that can reset connections,
so an out-of-order or lost upload leaves a wrong row behind and fails the final check.

Most kills wait until the service's uploads reach the endpoint, then come at a random moment of the
flow: a fixed 4-13 s after the start landed every kill in Spark's start-up on a slower host (its first
batch starts ~10 s after the process), so nothing was ever uploaded and left uncommitted by a killed
service (29 Nov 2026: 12 kills, no upload from any of them, duplicate overhead 1.000). The producer
keeps writing until the last kill, so every service has data to move.
"""

from __future__ import annotations

import os
import random
import threading
import time
from urllib.parse import urlsplit

import pytest

from devkit.chaos_proxy import ChaosProxy
from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import wait_until
from tests.e2e.checks import (
    all_committed,
    assert_ranges_cover,
    assert_table_exact,
    duplicate_overhead,
    table_matches,
    uploaded_ranges,
)

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

PARTITIONS = 4
KILLS = 12
BROKER_PAUSE_AT, BROKER_PAUSE_S = 6, 8  # before this kill, the broker is paused (SIGSTOP) instead
KEYS, VERSIONS = 500, 10  # 5,000 records a burst, one burst every BURST_EVERY_S until the last kill
BURST_EVERY_S = 4.0
MAX_BURSTS = 60  # bounds the data if the kills take longer than expected
STARTUP_KILL_EVERY = 4  # every fourth kill comes at a random moment of the start-up instead
FLOW_TIMEOUT_S = 90


def _delivered_prefix(ems, topic: str) -> dict[int, int]:
    """Per partition, the end of the run of uploaded offsets that starts at 0 without a gap."""
    prefix = {}
    for partition, spans in uploaded_ranges(ems, topic).items():
        covered = 0
        for first, last in sorted(set(spans)):
            if first > covered:
                break
            covered = max(covered, last + 1)
        prefix[partition] = covered
    return prefix


def test_twelve_kills_with_endpoint_and_broker_faults_lose_nothing(own_broker, ems_last_upload, unique, service_env,
                                                                   services):
    ems = ems_last_upload
    bootstrap = own_broker.bootstrap
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "20261123")))
    topic, group = unique("chaos"), unique("group")
    create_topics(bootstrap, {topic: PARTITIONS})
    proxy = ChaosProxy(urlsplit(ems.url).port)
    endpoint = proxy.url(urlsplit(ems.items_url()).path)
    env = service_env(topic, group, SINK_KAFKA_BOOTSTRAP_SERVERS=bootstrap, SINK_EMS_ENDPOINT=endpoint,
                      SINK_FLUSH_RECORDS=2000, SINK_MAX_FILES_PER_BATCH=4,
                      SINK_MAX_BATCH_RECORDS=8000, SINK_FLUSH_INTERVAL_MS=1000,
                      SINK_UPLOAD_RETRY_BUDGET_MS=4000, SINK_RESTART_BACKOFF_MAX_MS=2000)
    workload = Workload()

    kills_over = threading.Event()

    def produce() -> None:
        for burst in range(MAX_BURSTS):
            produce_orders(bootstrap, topic, keys=KEYS, updates=VERSIONS, workload=workload, seed=burst,
                           key_prefix=f"b{burst}")
            if kills_over.wait(BURST_EVERY_S):
                return


    producing = threading.Thread(target=produce)
    producing.start()
    # Each fault kind in turn (503s, slow replies, connection resets), at a random moment; once, a broker pause.
    faults = [lambda: ems.inject_fault(503, count=rng.randint(1, 4)),
              lambda: ems.inject_fault(delay_ms=1500, seconds=4),
              lambda: proxy.reset_for(3)]
    try:
        for kill in range(KILLS):
            service = services(env)
            if kill % STARTUP_KILL_EVERY == STARTUP_KILL_EVERY - 1:
                time.sleep(rng.uniform(4, 9))
            else:
                # Its own log, not the endpoint's count: an upload the killed service had in flight may
                # still land after the kill.
                wait_until(lambda: "uploaded topic=" in service.output(),  # noqa: B023 - within this iteration
                           FLOW_TIMEOUT_S, f"kill {kill + 1}: the service's first upload", process=service)
                time.sleep(rng.uniform(0, 3))
            fault = (lambda: own_broker.pause_for(BROKER_PAUSE_S)) if kill == BROKER_PAUSE_AT else \
                faults[kill % len(faults)]
            fault()
            time.sleep(rng.uniform(0.5, 3))
            service.kill9()
            ems.clear_faults()
            committed = committed_offsets(bootstrap, group, topic, PARTITIONS)
            prefix = _delivered_prefix(ems, topic)
            ahead = {p: (o, prefix.get(p, 0)) for p, o in committed.items() if o > prefix.get(p, 0)}
            assert not ahead, (f"kill {kill + 1}: committed past the delivered prefix: {ahead}\n"
                               + service.output()[-3000:])
        kills_over.set()
        producing.join()
        service = services(env)
        wait_until(lambda: table_matches(ems, topic, workload), 240, "convergence after the kills", process=service)
        wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS), 60, "final commits", process=service)
        code = service.terminate()
        assert code == 0, f"exit {code}\n" + service.output()[-3000:]
    finally:
        kills_over.set()
        producing.join()
        proxy.stop()
    ends = end_offsets(bootstrap, topic, PARTITIONS)
    assert sum(ends.values()) == workload.produced
    assert_table_exact(ems, topic, workload)
    assert_ranges_cover(ems, topic, ends, allow_replays=True)
    assert proxy.resets > 0, "the connection-reset fault never hit a connection"
    overhead = duplicate_overhead(ems, topic, ends)
    print(f"chaos: {KILLS} kills, {sum(ends.values())} records, 0 lost, duplicate overhead {overhead:.3f}")
    assert overhead < 2.0, f"{overhead:.3f} offsets uploaded per offset"
    # A kill between an upload and its commit replays the file: at least one of the kills must have come
    # there, or the run never tried what it exists for.
    assert overhead > 1.0, "no kill came between an upload and its commit: nothing was uploaded twice"
