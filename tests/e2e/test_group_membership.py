"""Two instances on one SINK_GROUP_ID share the partitions like Kafka consumers, and hand them over."""

from __future__ import annotations

import re
import threading
import time

import pytest
from confluent_kafka import Consumer

from devkit.brokers import free_port
from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import ServiceProcess, wait_until
from sink_service.kafka_source.membership import instance_id
from tests.e2e.checks import (
    all_committed,
    assert_ranges_cover,
    assert_table_exact,
    partitions_said_fresh,
    scrape_metrics,
    table_matches,
    uploaded_ranges,
)

pytestmark = pytest.mark.e2e

PARTITIONS = 4
_ASSIGNMENT = re.compile(r"group assignment: (\d+) partition\(s\)")
_UPLOAD = re.compile(r"^(\S+ \S+) INFO sink_service\.pipeline: uploaded topic=\S+ partition=(\d+) ", re.M)


def _assigned(service: ServiceProcess) -> int | None:
    """How many partitions the service's last logged assignment held."""
    found = _ASSIGNMENT.findall(service.output())
    return int(found[-1]) if found else None


def owner_changes(services: dict[str, ServiceProcess]) -> dict[int, list[str]]:
    """Per partition, which instance uploaded its files, in time order, with repeats collapsed.

    Two instances processing one partition at once would alternate: A, B, A, ...
    """
    uploads = sorted((stamp, int(partition), name) for name, service in services.items()
                     for stamp, partition in _UPLOAD.findall(service.output()))
    owners: dict[int, list[str]] = {}
    for _stamp, partition, name in uploads:
        seen = owners.setdefault(partition, [])
        if not seen or seen[-1] != name:
            seen.append(name)
    return owners


class CommitWatch:
    """Polls the group's committed offsets during the run and records any that moved backwards."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        self.backwards: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap, group, topic), daemon=True)
        self._thread.start()

    def _run(self, bootstrap: str, group: str, topic: str) -> None:
        seen: dict[int, int] = {}
        while not self._stop.wait(0.2):
            for partition, offset in committed_offsets(bootstrap, group, topic, PARTITIONS).items():
                if offset < seen.get(partition, -1):
                    self.backwards.append(f"partition {partition}: {seen[partition]} -> {offset}")
                seen[partition] = max(offset, seen.get(partition, -1))

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(10)
        return self.backwards


def test_a_second_instance_shares_the_partitions_and_takes_over(
        bootstrap, ems, unique, service_env, services, tmp_path):
    topic, group = unique("group"), unique("group")
    create_topics(bootstrap, {topic: PARTITIONS})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=3000, updates=2, workload=workload)

    def env(name: str) -> dict[str, str]:
        return service_env(topic, group, SINK_FLUSH_RECORDS=250, SINK_MAX_FILES_PER_BATCH=4,
                           SINK_MAX_BATCH_RECORDS=1000,
                           SINK_SCRATCH_DIR=str(tmp_path / name))

    watch = CommitWatch(bootstrap, group, topic)
    first = services(env("a"))
    wait_until(lambda: _assigned(first) == PARTITIONS, 120, "the first instance owns every partition",
               process=first)
    wait_until(lambda: any(committed_offsets(bootstrap, group, topic, PARTITIONS).values()), 60,
               "the first commits", process=first)
    second = services(env("b"))
    wait_until(lambda: _assigned(second) == 2 and _assigned(first) == 2, 120,
               "both instances own two partitions each", process=second)
    produce_orders(bootstrap, topic, keys=1000, updates=1, workload=workload, seed=3, key_prefix="both")
    wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS) and table_matches(ems, topic, workload),
               120, "delivery by the two instances", process=second)
    # Handing partitions over waits for the batch in flight: a partition moves once, from A to B.
    # (A real broker accepts that batch's commit during the rebalance; noida-db already refuses
    # it with ILLEGAL_GENERATION, so the new owner replays that one batch.) A partition that A had
    # not uploaded a file of yet when B joined shows B alone: still one move.
    assert_ranges_cover(ems, topic, end_offsets(bootstrap, topic, PARTITIONS), allow_replays=True)
    changes = owner_changes({"a": first, "b": second})
    assert all(owners in (["a"], ["b"], ["a", "b"]) for owners in changes.values()), changes

    # A restarted instance (same host and scratch area: the same static member) takes its place
    # back at once, without a rebalance wait, after SIGTERM and after kill -9 alike. (noida-db
    # never hands a stopped static member's partitions to the other instance; a real broker does
    # after the session timeout.)
    assert first.terminate() == 0
    produce_orders(bootstrap, topic, keys=500, updates=1, workload=workload, seed=5, key_prefix="after")
    restarted_at = time.monotonic()
    stopped, first = first, services(env("a"))
    wait_until(lambda: _assigned(first) == 2, 60, "the restarted instance gets its partitions back", process=first)
    rejoin_s = time.monotonic() - restarted_at
    wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS) and table_matches(ems, topic, workload),
               60, "delivery after the restart", process=first)
    assert_ranges_cover(ems, topic, end_offsets(bootstrap, topic, PARTITIONS), allow_replays=True)
    owners = owner_changes({"a": stopped, "a again": first, "b": second})
    assert all(seen in (["a", "a again"], ["a", "b"], ["b"]) for seen in owners.values()), owners

    second.kill9()
    produce_orders(bootstrap, topic, keys=500, updates=1, workload=workload, seed=9, key_prefix="killed")
    second = services(env("b"))
    wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS) and table_matches(ems, topic, workload),
               120, "delivery after kill -9", process=second)
    assert first.terminate() == 0 and second.terminate() == 0
    assert watch.stop() == [], "committed offsets moved backwards"
    assert_table_exact(ems, topic, workload)
    assert_ranges_cover(ems, topic, end_offsets(bootstrap, topic, PARTITIONS), allow_replays=True)
    assert rejoin_s < 60, f"rejoining took {rejoin_s:.1f}s"


def test_an_instance_without_partitions_is_a_ready_idle_standby(bootstrap, ems, unique, service_env, services,
                                                                 tmp_path):
    topic, group = unique("standby"), unique("group")
    create_topics(bootstrap, {topic: 1})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=200, updates=1, workload=workload)
    envs = [service_env(topic, group, SINK_SCRATCH_DIR=str(tmp_path / name)) for name in ("a", "b")]
    first = services(envs[0])
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), 120, "the first instance's commits", process=first)
    second = services(envs[1])
    # The assignor, not the order of arrival, decides which of the two keeps the one partition.
    instances = {int(env["SINK_HTTP_PORT"]): service for env, service in zip(envs, (first, second), strict=True)}
    wait_until(lambda: sorted(_assigned(s) or 0 for s in instances.values()) == [0, 1]
               and all((s.readiness(port) or (0,))[0] == 200 for port, s in instances.items()), 120,
               "one owner and one ready standby", process=second)
    port, standby = next((port, s) for port, s in instances.items() if _assigned(s) == 0)
    owner = next(s for s in instances.values() if s is not standby)
    standby_log_from = len(standby.output())
    samples = scrape_metrics(port)
    assert samples[("sink_assigned_partitions", ())] == 0
    assert not [key for key in samples if key[0] == "sink_consumer_lag_records"], "a standby reports no lag"
    produce_orders(bootstrap, topic, keys=100, updates=1, workload=workload, seed=3, key_prefix="more")
    wait_until(lambda: all_committed(bootstrap, group, topic, 1) and table_matches(ems, topic, workload), 60,
               "delivery by the owner", process=owner)
    assert first.terminate() == 0 and second.terminate() == 0
    assert "uploaded topic=" not in standby.output()[standby_log_from:]


def test_sigterm_while_the_broker_is_unreachable_at_start_stops_at_once(unique, service_env, services):
    # No broker answers: the service waits for the group's assignment. A stop must not wait that out
    # (60 s, longer than a pod's grace period).
    env = service_env(unique("nobroker"), unique("group"), SINK_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}")
    service = services(env)
    wait_until(lambda: "HTTP endpoints on port" in service.output() and "spark" in service.output().lower(), 60,
               "the service starting", process=service)
    time.sleep(8)  # Spark up, waiting for the group
    started = time.monotonic()
    assert service.terminate(timeout_s=30) == 0, service.output()[-3000:]
    assert time.monotonic() - started < 15, f"the stop took {time.monotonic() - started:.1f}s"
    assert "cannot reach Kafka" not in service.output().split("stop requested")[-1]


LOST_FILES = 40  # the batch in flight when its partition is lost: 40 files of 100 records
LOST_UPLOAD_DELAY_MS = 1000  # each upload takes a second: the batch runs for ~40 s
# From the broker giving the partition away to the old owner's last upload: the member hears of it at
# its next heartbeat (3 s), the query stops within 0.5 s, and Spark kills a Python task that does not
# end by itself within ~4 s of its cancel (spark.python.task.killTimeout after a 2 s check).
LOST_STOP_S = 10


def _log_time(line: str) -> float:
    """Wall-clock time of a service log line (`2026-01-02 03:04:05,678 ...`, local time)."""
    stamp, millis = line[:23].split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def test_a_lost_assignment_stops_the_uploads_of_the_batch_in_flight(bootstrap, ems, unique, service_env, services,
                                                                     tmp_path):
    # Another client joins under this instance's group.instance.id, as a restarted twin would: the
    # broker fences the running member and gives the partition away at once. The batch in flight
    # must stop uploading then, not finish its files alongside the partition's new owner.
    topic, group = unique("lost"), unique("group")
    create_topics(bootstrap, {topic: 1})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=LOST_FILES * 100, updates=1, workload=workload, partition=0)
    env = service_env(topic, group, SINK_FLUSH_RECORDS=100, SINK_MAX_FILES_PER_BATCH=LOST_FILES,
                      SINK_MAX_BATCH_RECORDS=LOST_FILES * 100,
                      SINK_SCRATCH_DIR=str(tmp_path / "a"))

    def uploads() -> list[tuple[int, float]]:
        """(first offset, arrival time) of each file, in arrival order."""
        spans = uploaded_ranges(ems, topic).get(0, [])
        return [(first, u["received_at"]) for (first, _last), u in zip(spans, ems.uploads(topic), strict=True)]

    def committed() -> int:
        return committed_offsets(bootstrap, group, topic, 1).get(0, 0)

    ems.inject_fault(delay_ms=LOST_UPLOAD_DELAY_MS)
    try:
        service = services(env)
        # The first batch after a start holds one file per core (two here) and may be seen with both
        # uploaded a moment before its commit; the batch to lose is the next one, of LOST_FILES files.
        wait_until(lambda: committed() > 0, 180, "the first batch's commit", process=service)
        # Two files of a batch not committed yet: the batch in flight is uploading.
        wait_until(lambda: len([f for f, _at in uploads() if f >= committed()]) >= 2, 180,
                   "a batch uploading", process=service)
        lost_from = committed()
        scratch = re.search(r"scratch area (\S+)", service.output())[1]
        intruder = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                             "group.instance.id": instance_id(scratch), "session.timeout.ms": 10_000,
                             "enable.auto.commit": False})
        intruder.subscribe([topic])
        deadline = time.monotonic() + 30
        while not intruder.assignment() and time.monotonic() < deadline:
            intruder.poll(0.1)
        assert intruder.assignment(), "the client under the same instance id got no partition"
        given_away_at = time.time()
        intruder.close()  # the fenced instance rejoins and takes the partition back
        wait_until(lambda: service.output().count("starting query at") >= 2, 120,
                   "the query restarted on the partition", process=service)
        time.sleep(LOST_STOP_S)  # stragglers of the lost batch, if any, arrive meanwhile
        ems.clear_faults()
        wait_until(lambda: all_committed(bootstrap, group, topic, 1) and table_matches(ems, topic, workload), 120,
                   "delivery after the partition came back", process=service)
        assert service.terminate() == 0
    finally:
        ems.clear_faults()
    restart = [line for line in service.output().splitlines() if "starting query at" in line][1]
    restarted_at, restart_from = _log_time(restart), int(re.search(r": (\d+)\}", restart)[1])
    assert restart_from == lost_from, "the lost batch committed: it was not lost"
    # Files that arrive after the restart are the new query's: from `restart_from` up, one after the
    # other. Any other file that arrives after the partition was given away is the lost batch's.
    lost_batch, expected = [], restart_from
    for first, at in uploads():
        if at > restarted_at and first == expected:
            expected = first + 100
        elif at > given_away_at:
            lost_batch.append((first, at))
    overlap_s = max((at for _first, at in lost_batch), default=given_away_at) - given_away_at
    restart_s = restarted_at - given_away_at
    print(f"lost assignment: {len(lost_batch)} file(s) of the lost batch arrived after the partition was given "
          f"away, the last {overlap_s:.1f}s after; the query restarted {restart_s:.1f}s after")
    assert overlap_s < LOST_STOP_S, (f"the lost batch kept uploading {overlap_s:.1f}s after its partition was "
                                     f"given away ({len(lost_batch)} files: {lost_batch})")
    assert restart_s < LOST_STOP_S
    assert_table_exact(ems, topic, workload)
    assert_ranges_cover(ems, topic, {0: LOST_FILES * 100}, allow_replays=True)


# Put on the service's PYTHONPATH: the group member's thread fails right after it served its first
# commit, as it did when a SINK_KAFKA_* override (cooperative-sticky) made its assign raise.
_KILL_MEMBER_THREAD = """
import os
import sys

sys.path.insert(0, os.getcwd())  # the checkout the service runs from (`-m` adds it only after this file)
try:
    from sink_service.kafka_source.membership import GroupMembership
except ImportError:  # a process without the project on its path
    GroupMembership = None

if GroupMembership is not None:
    _serve, _commit = GroupMembership._serve_commits, GroupMembership._commit

    def _commit_once(self, request):
        _commit(self, request)
        self.injected_commit_done = True

    def _serve_then_fail(self):
        _serve(self)
        if getattr(self, "injected_commit_done", False):
            raise RuntimeError("injected: the group member's thread failed")

    GroupMembership._commit, GroupMembership._serve_commits = _commit_once, _serve_then_fail
"""


def test_a_group_member_thread_that_dies_stops_the_service_with_a_clear_error(
        bootstrap, ems, unique, service_env, services, tmp_path):
    # Without its member thread nothing answers a commit: the service used to run on, every commit
    # timing out after 30 s and every batch replayed, forever, with no error but the thread's traceback.
    topic, group = unique("member-dies"), unique("group")
    create_topics(bootstrap, {topic: 1})
    produce_orders(bootstrap, topic, keys=500, updates=1, workload=Workload())
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_KILL_MEMBER_THREAD)
    service = services({**service_env(topic, group), "PYTHONPATH": str(inject)})
    started = time.monotonic()
    assert service.wait(180) == 3, service.output()[-3000:]
    output = service.output()
    assert "injected: the group member's thread failed" in output
    stopping = [line for line in output.splitlines() if "ERROR sink_service: stopping:" in line]
    assert stopping and "consumer group member" in stopping[-1] and "no commit can be made" in stopping[-1], \
        output[-3000:]
    print(f"member thread died: the service exited 3 after {time.monotonic() - started:.0f}s (Spark start included)")


REPLICAS = 3
REPLICA_PARTITIONS = 6
GROUP_FORMING_ATTEMPTS = 3


@pytest.mark.parametrize("starting", ["latest", "timestamp"])
def test_replicas_of_a_new_group_started_together_all_start_where_the_setting_says(
        bootstrap, ems, unique, service_env, services, tmp_path, starting):
    # Issue #38: the first replica resolved `latest` and committed its partitions; the others then saw
    # "the group has committed before" and started theirs at earliest, re-sending the whole backlog.
    topic, group = unique("replicas"), unique("group")
    create_topics(bootstrap, {topic: REPLICA_PARTITIONS})
    produce_orders(bootstrap, topic, keys=3000, updates=2, workload=Workload(), key_prefix="backlog")
    ends = end_offsets(bootstrap, topic, REPLICA_PARTITIONS)
    if starting == "timestamp":  # a moment after the backlog: every partition starts at its end
        time.sleep(0.01)
        starting = "timestamp:" + time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1)) + "Z"
    for attempt in range(GROUP_FORMING_ATTEMPTS):
        envs = [service_env(topic, group, SINK_STARTING_OFFSETS=starting, SINK_FLUSH_INTERVAL_MS=1000,
                            SINK_SCRATCH_DIR=str(tmp_path / f"replica-{attempt}-{n}")) for n in range(REPLICAS)]
        replicas = [services(env) for env in envs]  # at once: their starts interleave as they will
        try:
            wait_until(lambda: all(_assigned(s) == REPLICA_PARTITIONS // REPLICAS for s in replicas)  # noqa: B023
                       and all((s.readiness(int(env["SINK_HTTP_PORT"])) or (0,))[0] == 200
                               for s, env in zip(replicas, envs, strict=True)), 90,  # noqa: B023
                       "three ready replicas with two partitions each")
            break
        except AssertionError:
            # noida-db sometimes never forms a group whose members join within ~0.6 s of each other (reproduced
            # with bare group members, without the service): a broker fault, not the start being tested. Nothing
            # was assigned, so nothing was committed; the same start is tried again as a new group.
            if any(_assigned(s) for s in replicas) or committed_offsets(bootstrap, group, topic, REPLICA_PARTITIONS):
                raise
            for replica in replicas:
                replica.kill9()
            group = unique("group")
    else:
        raise AssertionError(f"noida-db formed no group of three in {GROUP_FORMING_ATTEMPTS} tries")
    try:
        new = Workload()
        produce_orders(bootstrap, topic, keys=300, updates=2, workload=new, key_prefix="new")
        wait_until(lambda: all_committed(bootstrap, group, topic, REPLICA_PARTITIONS), 180,
                   "the new records delivered")
    except AssertionError as exc:
        tails = "\n".join(f"--- replica {n}:\n{s.output()[-2500:]}" for n, s in enumerate(replicas))
        raise AssertionError(f"{exc}\n{tails}") from None
    samples = [scrape_metrics(int(env["SINK_HTTP_PORT"])) for env in envs]
    assert all(s.terminate() == 0 for s in replicas)

    first = {p: min(f for f, _last in spans) for p, spans in uploaded_ranges(ems, topic).items()}
    below = {p: (first[p], ends[p]) for p in first if first[p] < ends[p]}
    assert not below, f"partitions started below the end they had at the start (first delivered, end): {below}"
    assert_table_exact(ems, topic, new)  # every new record, none of the backlog
    fresh = sum(v for sample in samples for (name, labels), v in sample.items()
                if name == "sink_partitions_started_without_commit_total" and ("topic", topic) in labels)
    # Counted by the replica that decided: once, or twice for replicas whose starts met at the same moment.
    assert REPLICA_PARTITIONS <= fresh <= REPLICAS * REPLICA_PARTITIONS, f"{fresh} start(s) without a commit counted"
    said = sum(partitions_said_fresh(s.output(), topic) for s in replicas)
    assert said == fresh, f"WARNINGs name {said} partition(s) for {fresh} counted start(s)"
