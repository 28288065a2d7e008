"""Broker faults: the broker paused, restarted on its data, and unreachable for a while.

Each test starts its own noida-db broker (the session broker other tests share is left alone),
runs the service against it with records flowing, injects the fault and checks that the service
recovers by itself, loses nothing, commits to the end and that `/readyz` reported the outage.
Delivery goes to the last-upload-wins endpoint, so a partition's files arriving out of order fail
the table check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from devkit.brokers import OwnBroker
from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import ServiceProcess, wait_until
from local_ems.server import LocalEmsServer
from tests.e2e.checks import all_committed, assert_ranges_cover, assert_table_exact, table_matches

pytestmark = pytest.mark.e2e

PARTITIONS = 3
BROKER_CHECK_S = 5.0  # the service asks the broker for offsets this often (OFFSET_MONITOR_INTERVAL_S)
OFFSETS_ATTEMPT_S = 8.0  # one attempt of the service's offsets client (kafka_source.offsets)
BROKER_ANSWER_S = 5.0  # a broker check without an answer this long marks it unreachable (driver.pipeline)
# The longest outage readiness may miss: a check starts within BROKER_CHECK_S of the outage's start and says
# so BROKER_ANSWER_S later. Outages in these tests last longer.
SHOWN_WITHIN_S = BROKER_CHECK_S + BROKER_ANSWER_S
RESUMED_WITHIN_S = 25.0  # after a restart: one offsets attempt (8 s), the query's start and a batch


@dataclass
class Run:
    broker: OwnBroker
    ems: LocalEmsServer
    service: ServiceProcess
    topic: str
    group: str
    port: int
    workload: Workload

    def committed(self) -> int:
        return sum(committed_offsets(self.broker.bootstrap, self.group, self.topic, PARTITIONS).values())

    def readiness(self) -> tuple[int, dict] | None:
        return self.service.readiness(self.port)


@pytest.fixture
def started(own_broker, ems_last_upload, unique, service_env, services) -> Callable[[], Run]:
    """The service mid-way through a backlog on the test's own broker: records are flowing."""
    def start() -> Run:
        topic, group = unique("broker-fault"), unique("group")
        create_topics(own_broker.bootstrap, {topic: PARTITIONS})
        workload = Workload()
        produce_orders(own_broker.bootstrap, topic, keys=3000, updates=3, workload=workload)
        env = service_env(topic, group, SINK_KAFKA_BOOTSTRAP_SERVERS=own_broker.bootstrap,
                          SINK_EMS_ENDPOINT=ems_last_upload.items_url(), SINK_FLUSH_RECORDS=500,
                          SINK_MAX_FILES_PER_BATCH=2, SINK_MAX_BATCH_RECORDS=1000,
                          SINK_RESTART_BACKOFF_MAX_MS=4000)
        run = Run(own_broker, ems_last_upload, services(env), topic, group, int(env["SINK_HTTP_PORT"]), workload)
        wait_until(lambda: run.committed() > 0, 120, "first commits", process=run.service)
        total = sum(end_offsets(own_broker.bootstrap, topic, PARTITIONS).values())
        assert run.committed() < total, "the backlog was drained before the fault; make it larger"
        return run
    return start


def _outage_readiness(run: Run, outage: Callable[[], None]) -> list[dict]:
    """Run `outage` (which returns when the fault is over) while polling /readyz; the 503 answers."""
    seen: list[dict] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            state = run.readiness()
            if state is not None and state[0] == 503:
                seen.append(state[1])
            done.wait(0.5)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        outage()
    finally:
        done.set()
        poller.join(5)
    return seen


def _assert_recovered(run: Run, not_ready: list[dict]) -> None:
    """Readiness showed the outage; then everything, old and new, is delivered and committed."""
    # The broker check's own finding, not only a 503 between queries (which says why too, but not this).
    assert any(not state["broker_reachable"] and state["reason"] for state in not_ready), (
        f"/readyz never answered 503 for the broker, with a reason, during the outage: {not_ready}\n"
        + run.service.output()[-3000:])
    # More records after the fault: the service must take them up without a restart.
    produce_orders(run.broker.bootstrap, run.topic, keys=500, updates=2, workload=run.workload,
                   key_prefix="after")
    bootstrap = run.broker.bootstrap
    wait_until(lambda: table_matches(run.ems, run.topic, run.workload), 120, "delivery after the fault",
               process=run.service)
    wait_until(lambda: all_committed(bootstrap, run.group, run.topic, PARTITIONS), 60, "commits to the end",
               process=run.service)
    wait_until(lambda: (run.readiness() or (0,))[0] == 200, 30, "ready again", process=run.service)
    assert run.service.terminate() == 0
    assert_table_exact(run.ems, run.topic, run.workload)
    assert_ranges_cover(run.ems, run.topic, end_offsets(bootstrap, run.topic, PARTITIONS), allow_replays=True)


def test_broker_paused_for_15s_then_resumed(own_broker, started):
    run = started()

    _assert_recovered(run, _outage_readiness(run, lambda: own_broker.pause_for(15)))


def _restart(broker: OwnBroker, down_s: float) -> Callable[[], None]:
    """Stop the broker, leave its port refusing connections for `down_s`, start it on the same data."""
    def restart() -> None:
        broker.stop()
        time.sleep(down_s)
        broker.start()
    return restart


def test_broker_restarted_on_its_data_directory(own_broker, started):
    run = started()
    before = run.committed()
    # A restart takes about a second here, which the clients ride out by reconnecting. Down for longer
    # than an offsets attempt (8 s) and than SHOWN_WITHIN_S, readiness must show it. (Down 6 s, the broker
    # answered within the attempt; down 9 s, in a loaded CI run no check saw the outage: the one in flight
    # began too late to go 5 s without an answer before the broker was back.)
    not_ready = _outage_readiness(run, _restart(own_broker, max(OFFSETS_ATTEMPT_S, SHOWN_WITHIN_S) + 2))
    # The broker came back on its data: the group's commits are still there. (The fixture once killed
    # the broker while it saved, and this test ran against an empty broker without noticing.)
    assert run.committed() >= before, "the restarted broker lost the group's committed offsets"
    # The group rebalances and the service restarts its query: an offsets client that knew the old
    # broker waited out its whole 30 s request timeout before a new one was asked (then 120 s timed out
    # in a loaded run); one attempt now lasts 8 s.
    wait_until(lambda: run.committed() > before, RESUMED_WITHIN_S, "commits resumed after the restart",
               process=run.service)
    _assert_recovered(run, not_ready)


def test_broker_unreachable_for_12s(own_broker, started):
    # noida-db cannot make only metadata requests fail. The approximation: the broker is down for
    # 12 s, so every request (metadata included) is refused at the port, then it comes back on
    # the same data. (A pause, the other way to fail requests, is the first test.)
    run = started()
    _assert_recovered(run, _outage_readiness(run, _restart(own_broker, SHOWN_WITHIN_S + 2)))
