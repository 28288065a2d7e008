"""Upload order: one partition's files reach EMS in offset order, one at a time, replays included.

EMS may apply files in arrival order (BRIEF section 3), so a key's latest version survives only if
no file of its partition arrives after a newer one. The endpoint here lets the last upload win, and
the test reads its upload log to check the order itself, not only the end state it happened to give.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import wait_until
from local_ems.server import LocalEmsServer
from tests.e2e.checks import all_committed, assert_ranges_cover, assert_table_exact, table_matches, uploaded_ranges

pytestmark = pytest.mark.e2e

KEYS, VERSIONS = 200, 30  # every key is updated in every 200 offsets: each file holds all of them
FLUSH_RECORDS = 500
UPLOAD_DELAY_MS = 300  # slows the service down enough for the kill to land mid-stream
# A request the killed process had already sent can reach the endpoint's handler just after the
# kill, and is applied then. The restarted process cannot upload this soon (Spark alone takes
# seconds to start), so uploads in this window after a restart still belong to the killed run.
IN_FLIGHT_AT_KILL_S = 1.0


@dataclass(frozen=True)
class Run:
    """One service process: when it started (endpoint clock) and the committed offset it starts from."""

    started_at: float
    start_offset: int


@dataclass(frozen=True)
class Upload:
    first: int
    last: int
    received_at: float


def single_partition_uploads(ems: LocalEmsServer, topic: str) -> list[Upload]:
    """The uploads of a one-partition topic in the order the endpoint applied them."""
    log = ems.uploads(topic)
    spans = uploaded_ranges(ems, topic)[0]  # the same log, in the same order: every entry is partition 0
    return [Upload(first, last, entry["received_at"]) for (first, last), entry in zip(spans, log, strict=True)]


def _run_of(upload: Upload, runs: list[Run]) -> Run:
    """The run that sent `upload`: the latest started before it arrived, allowing for requests in flight at a kill."""
    started = [r for n, r in enumerate(runs) if r.started_at + (IN_FLIGHT_AT_KILL_S if n else 0) <= upload.received_at]
    return max(started, key=lambda r: r.started_at)


def order_violations(uploads: list[Upload], runs: list[Run]) -> list[str]:
    """Where arrival order breaks offset order; empty when it holds.

    Within one run each upload starts right after the previous one ends. A run's first upload is a
    restart point: at or before the offset committed when the run started, and never past the end of
    what was uploaded before (no gap).
    """
    problems = []
    previous: Upload | None = None
    for n, upload in enumerate(uploads):
        run = _run_of(upload, runs)
        first_of_run = previous is None or _run_of(previous, runs) is not run
        expected = 0 if previous is None else previous.last + 1
        if first_of_run:
            if upload.first > min(run.start_offset, expected):
                problems.append(f"upload #{n} {upload.first}-{upload.last} starts a run above its restart point "
                                f"{min(run.start_offset, expected)}")
        elif upload.first != expected:
            kind = "skips ahead past" if upload.first > expected else "goes back before"
            problems.append(f"upload #{n} {upload.first}-{upload.last} {kind} offset {expected} within one run")
        previous = upload
    return problems


def test_one_partitions_files_reach_the_endpoint_in_offset_order_across_a_kill(
        bootstrap, ems_last_upload, unique, service_env, services):
    ems = ems_last_upload
    topic, group = unique("upload-order"), unique("group")
    create_topics(bootstrap, {topic: 1})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=KEYS, updates=VERSIONS, workload=workload, partition=0)
    total = end_offsets(bootstrap, topic, 1)[0]
    env = service_env(topic, group, SINK_EMS_ENDPOINT=ems.items_url(), SINK_FLUSH_RECORDS=FLUSH_RECORDS,
                      SINK_MAX_FILES_PER_BATCH=8, SINK_MAX_BATCH_RECORDS=8 * FLUSH_RECORDS)

    def committed() -> int:
        return committed_offsets(bootstrap, group, topic, 1).get(0, 0)

    ems.inject_fault(delay_ms=UPLOAD_DELAY_MS)
    try:
        runs = [Run(time.time(), 0)]
        service = services(env)
        wait_until(lambda: committed() > 0, 120, "a first commit", process=service)
        service.kill9()
        runs.append(Run(time.time(), committed()))
        assert runs[-1].start_offset < total, "the backlog was delivered before the kill; make it larger"

        service = services(env)
        wait_until(lambda: table_matches(ems, topic, workload), 240, "convergence after the restart",
                   process=service)
        wait_until(lambda: all_committed(bootstrap, group, topic, 1), 60, "final commits", process=service)
        assert service.terminate() == 0
    finally:
        ems.clear_faults()

    uploads = single_partition_uploads(ems, topic)
    assert len(uploads) >= total // FLUSH_RECORDS, "fewer files than the flush size gives; the test proves little"
    arrival = ", ".join(f"{u.first}-{u.last}" for u in uploads)
    assert order_violations(uploads, runs) == [], f"arrival order: {arrival}; runs: {runs}"
    assert_table_exact(ems, topic, workload)
    assert_ranges_cover(ems, topic, {0: total}, allow_replays=True)
