"""Per-partition gauges follow the group's assignment: only a partition's owner reports it."""

from __future__ import annotations

from sink_service.driver.metrics import SinkMetrics


def series(metrics: SinkMetrics, name: str) -> set[tuple[str, str]]:
    return {(s.labels["topic"], s.labels["partition"]) for family in metrics.registry.collect()
            for s in family.samples if s.name == name}


def test_partitions_moved_elsewhere_stop_being_reported_and_kept_ones_survive():
    metrics = SinkMetrics()
    metrics.record_commits({("orders", 0): 10, ("orders", 1): 20})
    metrics.record_lag({("orders", 0): 10, ("orders", 1): 20}, {("orders", 0): 15, ("orders", 1): 25})
    metrics.record_repeated_failures({("orders", 1): 2})

    metrics.keep_partitions({("orders", 0), ("orders", 1)})  # a replay on the same assignment
    assert series(metrics, "sink_last_commit_timestamp_seconds") == {("orders", "0"), ("orders", "1")}

    metrics.keep_partitions({("orders", 0)})  # partition 1 moved to another instance
    for name in ("sink_consumer_lag_records", "sink_committed_offset", "sink_last_commit_timestamp_seconds"):
        assert series(metrics, name) == {("orders", "0")}, name
    assert series(metrics, "sink_repeated_failures") == set()
