"""Delta chaos: at least ten `kill -9` at random moments while keyed updates and deletes flow into a Delta
table on S3 (moto's server, as its own process), reached through a proxy that resets connections; moto itself
is stopped (SIGSTOP) for a few seconds at times, so requests hang and time out mid-merge and mid-commit.

Hard deletes are on: a file applied twice after a key's delete would bring the key back, so the final table
alone would catch a duplicate application; the table's history counts them anyway and must count zero.
After every kill, no partition's committed Kafka offset may be ahead of the table's application transaction
(Kafka follows the table, never leads it). Not in the default suite: `.venv/bin/pytest -m chaos`.

The producer writes until the last kill, so every life has data to move: with a fixed 12 bursts (48 s) the
last lives met a drained topic (29 Nov 2026: the eleventh kill came after a 60 s wait for a commit that never
came, and no file was ever skipped as already applied; with the producer running, 3 were). A kill that waits
for its life's commit fails the test if none comes.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import requests

from devkit.brokers import free_port
from devkit.chaos_proxy import ChaosProxy
from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed
from tests.e2e.delta_checks import (
    CONFLICT_RETRY,
    S3_CREDENTIALS,
    SKIPPED,
    DeltaLocation,
    applications,
    change_log_pending_bytes,
    check_change_log_table,
    check_table,
    count_in_logs,
    delete_env,
    produce_orders_with_deletes,
)
from uploader.delta_settings import CHANGES_SUFFIX

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

PARTITIONS = 4
KILLS = int(os.environ.get("DELTA_CHAOS_KILLS", "12"))
KEYS, VERSIONS = 400, 6  # 2,400 records a burst, one every BURST_EVERY_S until the last kill
BURST_EVERY_S = 4.0
MAX_BURSTS = 60  # bounds the data if the kills take longer than expected
FLOW_TIMEOUT_S = 90
MOTO_PAUSE_S = 5
_DURATION = re.compile(r"merged \d+ staged file\(s\) .* in ([\d.]+)s, ")  # the driver's merge of a batch


# moto's server in its own process (the test stops it with SIGSTOP), its writes one at a time (devkit.moto_s3).
_MOTO_MAIN = """
import sys
from werkzeug.serving import run_simple
from moto.moto_server.threaded_moto_server import MotoRequestHandler
from devkit.moto_s3 import serialized_app
run_simple("127.0.0.1", int(sys.argv[1]), serialized_app(), threaded=True, request_handler=MotoRequestHandler)
"""


class MotoProcess:
    """moto's S3 server as a child process, so it can be stopped (SIGSTOP) and resumed with its state."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _MOTO_MAIN, str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])  # imports devkit
        self.pauses = 0
        wait_until(self._up, 30, "moto's S3 server")

    def _up(self) -> bool:
        try:
            return requests.get(self.url, timeout=1).status_code < 500
        except requests.RequestException:
            return False

    def pause_for(self, seconds: float) -> None:
        """Stopped, not killed: connections hang (no reset), then everything resumes where it was."""
        self.process.send_signal(signal.SIGSTOP)
        self.pauses += 1
        timer = threading.Timer(seconds, self.process.send_signal, args=(signal.SIGCONT,))
        timer.daemon = True
        timer.start()

    def stop(self) -> None:
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        self.process.wait(10)
        self._log.close()


@pytest.fixture
def moto_process(tmp_path: Path) -> Iterator[MotoProcess]:
    server = MotoProcess(tmp_path / "moto.log")
    try:
        yield server
    finally:
        server.stop()


def _log_versions(location: DeltaLocation) -> int:
    """How many commit files the table's log holds (straight to moto, not through the proxy)."""
    bucket, prefix = location.uri.removeprefix("s3://").split("/", 1)
    pages = location.s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/_delta_log/")
    return sum(1 for page in pages for o in page.get("Contents", []) if o["Key"].endswith(".json"))


@pytest.mark.parametrize("change_log", [False, True], ids=["merge", "change-log"])
def test_delta_on_s3_through_kills_resets_and_a_stopped_store_is_exact_and_applied_once(
        change_log, bootstrap, moto_process, tmp_path, unique, service_env, services, monkeypatch):
    """In change-log mode the batches append to the change log (whose log is watched for commits and checked
    against Kafka's), and compactions at 5% of the table run through the kills and the faults too."""
    started = time.monotonic()
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "20261127")))
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    topic, group, bucket = unique("deltachaos"), unique("group"), unique("chaos")
    boto3.client("s3", endpoint_url=moto_process.url, region_name="us-east-1", **{
        k.lower(): v for k, v in S3_CREDENTIALS.items()}).create_bucket(Bucket=bucket)
    create_topics(bootstrap, {topic: PARTITIONS})
    proxy = ChaosProxy(int(moto_process.port))
    location = DeltaLocation(f"s3://{bucket}/tables/{topic}", moto_process.url)  # the checks read moto directly
    # Where the batches commit (with the partitions' transactions): the change log in change-log mode.
    batches = DeltaLocation(location.uri + CHANGES_SUFFIX, moto_process.url) if change_log else location
    env = service_env(topic, group, SINK_TARGET="delta", SINK_DELTA_TABLE_URI=f"s3://{bucket}/tables/{{topic}}",
                      SINK_S3_ENDPOINT_URL=proxy.url(""), SINK_S3_REGION="us-east-1", SINK_FLUSH_RECORDS=600,
                      SINK_MAX_FILES_PER_BATCH=3,
                      SINK_MAX_BATCH_RECORDS=1800, SINK_FLUSH_INTERVAL_MS=1000, SINK_UPLOAD_TIMEOUT_MS=3000,
                      SINK_UPLOAD_RETRY_BUDGET_MS=8000, SINK_RESTART_BACKOFF_MAX_MS=2000,
                      **delete_env(True), **S3_CREDENTIALS,
                      **({"SINK_DELTA_CHANGE_LOG": "true", "SINK_DELTA_COMPACT_AT_CHANGES_PERCENT": "5"}
                         if change_log else {}))
    env.pop("SINK_EMS_ENDPOINT")
    env.pop("SINK_EMS_AUTHORIZATION")
    workload = Workload()

    kills_over = threading.Event()

    def produce() -> None:
        for burst in range(MAX_BURSTS):
            produce_orders_with_deletes(bootstrap, topic, keys=KEYS, updates=VERSIONS, workload=workload,
                                        seed=burst, key_prefix=f"b{burst}")
            if kills_over.wait(BURST_EVERY_S):
                return

    producing = threading.Thread(target=produce)
    producing.start()
    faults = [lambda: proxy.reset_for(3), lambda: moto_process.pause_for(MOTO_PAUSE_S), lambda: None]
    fault_names = ["resets 3s", f"moto stopped {MOTO_PAUSE_S}s", "none"]
    timeline: list[str] = []  # per kill: the fault, how long the service lived, its commits to Kafka
    logs: list[Path] = []
    killed_mid_merge = 0
    try:
        for kill in range(KILLS):
            service = services(env)
            born = time.monotonic()
            logs.append(service.log_path)
            if kill % 2:  # a random moment after start: startup, planning, a merge, a commit, anything
                time.sleep(rng.uniform(5, 25))
            else:  # a random moment once this life's commits flow
                before = _log_versions(batches) if kill else 0
                wait_until(lambda: _log_versions(batches) > before, FLOW_TIMEOUT_S,  # noqa: B023 - this iteration
                           f"kill {kill + 1}: a commit of this life", interval_s=0.3, process=service)
                killed_mid_merge += 1
            faults[kill % len(faults)]()
            time.sleep(rng.uniform(0.5, 8))  # the service lives through (part of) the fault, retrying
            service.kill9()
            timeline.append(f"{fault_names[kill % len(faults)]}, {time.monotonic() - born:.0f}s, "
                            f"{service.output().count(' uploaded, committed ')} batches")
            committed = committed_offsets(bootstrap, group, topic, PARTITIONS)
            held = applications(batches.log(), group, topic).transactions if _log_versions(batches) else {}
            ahead = {p: (o, held.get(p, 0)) for p, o in committed.items() if o > held.get(p, 0)}
            assert not ahead, f"kill {kill + 1}: Kafka committed ahead of the table: {ahead}\n" + \
                service.output()[-3000:]
        kills_over.set()
        producing.join()
        # The last life compacts what the lives before left, changes no new batch brings up, whatever their share of
        # the table, within the max interval (at 5% of the table alone it would wait 600 s); a life before may have
        # compacted everything already (the lives after the producer's end see no new data).
        pending_at_start = change_log_pending_bytes(location, group, topic, tmp_path / "pending") if change_log else 0
        service = services({**env, "SINK_DELTA_COMPACT_MAX_INTERVAL_S": "5"} if change_log else env)
        logs.append(service.log_path)
        wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS), 300, "all commits after the kills",
                   process=service)
        if pending_at_start:
            wait_until(lambda: change_log_pending_bytes(location, group, topic, tmp_path / "pending") == 0, 120,
                       f"a compaction of the {pending_at_start} bytes pending", interval_s=2, process=service)
            assert "compacted the change log" in service.output()
        code = service.terminate()
        assert code == 0, f"exit {code}\n" + service.output()[-3000:]
    finally:
        kills_over.set()
        producing.join()
        proxy.stop()
    ends = end_offsets(bootstrap, topic, PARTITIONS)
    assert sum(ends.values()) == workload.produced
    check = check_change_log_table if change_log else check_table
    found = check(location, workload, topic, group, ends, hard_deletes=True)
    assert proxy.resets > 0, "the connection-reset fault never hit a connection"
    assert moto_process.pauses > 0
    if change_log:
        assert count_in_logs(logs, "compacted the change log") > 0, "the service compacted nothing"
    deleted = sum(1 for v in workload.expected_rows(topic).values() if v.get("_deleted"))
    durations = sorted(float(d) for path in logs for d in _DURATION.findall(path.read_text(errors="replace")))
    print(f"delta chaos: {KILLS} kills ({killed_mid_merge} once commits flowed), {sum(ends.values())} records, "
          f"{len(workload.expected_rows(topic))} keys ({deleted} ending deleted), 0 lost; "
          f"{found.applications} applications in {found.commits} commits ({found.cut} cut at the table's end), "
          f"duplicates {found.duplicates()}; conflicts retried {count_in_logs(logs, CONFLICT_RETRY)}, files "
          f"skipped as already applied {count_in_logs(logs, SKIPPED)}, other retries "
          f"{count_in_logs(logs, 'retrying in') - count_in_logs(logs, CONFLICT_RETRY)}; proxy resets "
          f"{proxy.resets}, moto stopped {moto_process.pauses}x{MOTO_PAUSE_S}s; merge durations median "
          f"{durations[len(durations) // 2]:.1f}s, max {durations[-1]:.1f}s (faults inside delta-rs's own retries); "
          f"{time.monotonic() - started:.0f}s\n"
          f"kills (fault, lifetime, batches): {timeline}")
