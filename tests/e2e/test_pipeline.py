"""End to end: a real broker, the service as a child process, the local EMS-compatible endpoint."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import wait_until
from devkit.spark_cluster import standalone_cluster
from tests.e2e.checks import (
    all_commands,
    all_committed,
    assert_ranges_cover,
    assert_table_exact,
    descendant_commands,
    table_matches,
)
from tests.e2e.conftest import AUTHORIZATION, POLL_INTERVAL_S

pytestmark = pytest.mark.e2e


def _deliver_two_topics(bootstrap, ems, unique, service_env, services, **overrides) -> None:
    topics = [unique("orders"), unique("tickets")]
    group = unique("group")
    create_topics(bootstrap, {t: 3 for t in topics})
    workload = Workload()
    for n, topic in enumerate(topics):
        produce_orders(bootstrap, topic, keys=4000, updates=5, workload=workload, seed=n)
    env = service_env(",".join(topics), group, SINK_FLUSH_RECORDS=1500, **overrides)
    service = services(env)

    for topic in topics:
        wait_until(lambda t=topic: table_matches(ems, t, workload), 240, f"{topic} to converge", process=service)
        wait_until(lambda t=topic: all_committed(bootstrap, group, t, 3), 60, f"{topic} commits", process=service)
    # The checkpoint is scratch, written through Hadoop's raw local file system: Hadoop's checksummed
    # one adds a .crc file to each file, and without its native library forks `chmod` for both.
    checkpoint_files = [p.name for p in Path(env["SINK_SCRATCH_DIR"]).rglob("*") if "checkpoints" in p.parts]
    assert any(name.isdigit() for name in checkpoint_files), checkpoint_files  # offsets/N and commits/N
    assert not [name for name in checkpoint_files if name.endswith(".crc")], checkpoint_files
    # Spark's search for pip-installed data sources is skipped: it cost a Python process on the
    # start-up path and left it idle, with its daemon, for the whole run.
    workers = descendant_commands(service.pid)
    # The streaming planner is seen (the planning steps' processes are ended once the query planned:
    # tests/e2e/test_planner_processes.py).
    assert any("python_streaming_source_runner" in cmdline for cmdline in workers), workers
    assert not [cmdline for cmdline in workers if "lookup_data_sources" in cmdline], workers
    # The driver of an EMS target plans and commits: its tasks build their decoders and target from the
    # configuration (task/recipe.py), so pyarrow and numpy (~50 MB) never load in it.
    driver_libraries = Path(f"/proc/{service.pid}/maps").read_text()
    assert "libarrow" not in driver_libraries and "numpy" not in driver_libraries
    # What `ps` shows any local user and every monitoring agent: no secret on any command line of
    # this machine (the driver's spark-submit, launcher and JVM, the cluster's daemons and executors).
    secrets = [str(value) for name, value in overrides.items() if "SECRET" in name]
    exposed = [cmdline for cmdline in all_commands() if any(secret in cmdline for secret in secrets)]
    assert not exposed, exposed
    assert service.terminate() == 0
    output = service.output()
    assert AUTHORIZATION not in output and AUTHORIZATION.split()[1] not in output
    assert not [name for name, value in overrides.items() if "SECRET" in name and str(value) in output]

    for topic in topics:
        assert_table_exact(ems, topic, workload)
        ends = end_offsets(bootstrap, topic, 3)
        assert committed_offsets(bootstrap, group, topic, 3) == ends
        files = assert_ranges_cover(ems, topic, ends, allow_replays=False)
        assert files >= 3 * 4, f"{topic}: expected several files per partition, got {files}"
    assert workload.produced == 40_000


def test_two_topics_three_partitions_end_to_end(bootstrap, ems, unique, service_env, services):
    _deliver_two_topics(bootstrap, ems, unique, service_env, services)


@pytest.mark.cluster
def test_end_to_end_on_standalone_cluster_with_two_workers(bootstrap, ems, unique, service_env, services):
    """With RPC authentication and encryption on: master and workers refuse a driver without the secret."""
    secret = "cluster-secret-e2e-0815"
    with standalone_cluster(workers=2, auth_secret=secret) as master:
        _deliver_two_topics(bootstrap, ems, unique, service_env, services, SINK_SPARK_MASTER=master,
                            SINK_SPARK_AUTH_SECRET=secret)


def test_idle_partition_flushes_on_time_while_another_is_busy(bootstrap, ems, unique, service_env, services):
    topic, group = unique("idle"), unique("group")
    create_topics(bootstrap, {topic: 2})
    interval_s = 3.0
    service = services(service_env(topic, group, SINK_FLUSH_RECORDS=2000, SINK_MAX_FILES_PER_BATCH=4,
                                   SINK_MAX_BATCH_RECORDS=8000,
                                   SINK_FLUSH_INTERVAL_MS=int(interval_s * 1000)))
    busy_workload = Workload()
    stop = threading.Event()

    def keep_partition_zero_busy() -> None:
        version = 0
        while not stop.is_set():
            produce_orders(bootstrap, topic, keys=200, updates=1, workload=busy_workload, seed=version,
                           partition=0, key_prefix=f"busy-{version}")
            version += 1
            time.sleep(0.1)

    busy = threading.Thread(target=keep_partition_zero_busy, daemon=True)
    busy.start()
    try:
        wait_until(lambda: any(u["fileName"].startswith(f"topic-{topic}_partition-0") for u in ems.uploads(topic)),
                   120, "the busy partition's first upload", process=service)
        idle = Workload()
        produced_at = time.monotonic()
        produce_orders(bootstrap, topic, keys=3, updates=1, workload=idle, partition=1, key_prefix="idle")
        wait_until(lambda: sum(1 for r in ems.table(topic) if r["id"].startswith("idle")) == 3,
                   interval_s + 10, "the idle partition's 3 records", interval_s=0.2, process=service)
        latency = time.monotonic() - produced_at
    finally:
        stop.set()
        busy.join()
    assert service.terminate() == 0
    # The interval (dated from the look before the records appeared), then at most one micro-batch
    # and one trigger period until the next look, then the micro-batch that writes them; never a
    # wait for the busy partition. Micro-batches are as slow as the machine is busy: use the slowest.
    slowest_batch_s = max(float(s) for s in re.findall(r"batch \d+: .* in (\d+\.\d+)s", service.output()))
    bound_s = interval_s + POLL_INTERVAL_S + 2 * slowest_batch_s + 1.0
    assert latency <= bound_s, (
        f"idle partition took {latency:.1f}s with a {interval_s}s interval "
        f"(bound {bound_s:.1f}s; slowest micro-batch {slowest_batch_s:.1f}s)"
    )
