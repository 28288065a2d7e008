"""Series the alerts need that the service's own registry must export: process memory and assignment time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sink_service.driver.metrics import ProcessTreeCollector, SinkMetrics

ASSIGNED = "sink_partition_assigned_timestamp_seconds"


def value(metrics: SinkMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_the_registry_exports_process_and_python_series():
    metrics = SinkMetrics()
    assert value(metrics, "process_resident_memory_bytes") > 0
    assert value(metrics, "process_start_time_seconds") > 0
    assert value(metrics, "sink_process_tree_resident_memory_bytes") >= value(metrics, "process_resident_memory_bytes")
    assert any(f.name == "python_info" for f in metrics.registry.collect())


def test_the_process_tree_counts_children_and_grandchildren():
    """The JVM and Spark's Python workers are (grand)children of the driver: their memory is the service's."""
    grandchild = "import time; b = bytearray(64 << 20); b[::4096] = b'x' * (len(b) // 4096); time.sleep(60)"
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); print(p.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    grandchild_pid = int(child.stdout.readline())
    try:
        deadline = time.monotonic() + 20
        while True:
            tree = ProcessTreeCollector().tree()
            if tree.get(grandchild_pid, 0) >= 64 << 20 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert {os.getpid(), child.pid, grandchild_pid} <= set(tree), tree
        assert tree[grandchild_pid] >= 64 << 20, "the grandchild's 64 MiB are counted"
        metrics = SinkMetrics()
        assert value(metrics, "sink_process_tree_processes") >= 3
        assert value(metrics, "sink_process_tree_resident_memory_bytes") >= (
            value(metrics, "process_resident_memory_bytes") + (64 << 20))
    finally:
        os.kill(grandchild_pid, signal.SIGKILL)
        child.kill()
        child.wait()


def test_assignment_time_is_set_once_kept_across_replays_and_dropped_when_moved():
    metrics = SinkMetrics()
    metrics.keep_partitions({("orders", 0), ("orders", 1)})
    first = value(metrics, ASSIGNED, topic="orders", partition="0")
    assert first and abs(first - time.time()) < 5
    time.sleep(0.01)
    metrics.keep_partitions({("orders", 0), ("orders", 1)})  # a replay restarts the query on the same assignment
    assert value(metrics, ASSIGNED, topic="orders", partition="0") == first
    metrics.keep_partitions({("orders", 0)})  # partition 1 moved to another instance
    assert value(metrics, ASSIGNED, topic="orders", partition="1") is None
    metrics.keep_partitions({("orders", 0), ("orders", 1)})  # and back: counted from now
    assert value(metrics, ASSIGNED, topic="orders", partition="1") > first
    assert value(metrics, ASSIGNED, topic="orders", partition="0") == first
