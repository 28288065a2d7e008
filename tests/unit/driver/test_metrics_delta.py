"""Delta table maintenance, run by the driver after a merge commit on a due version, counted by step and result."""

from __future__ import annotations

from sink_service.driver.metrics import SinkMetrics


def _count(metrics: SinkMetrics, step: str, result: str) -> float:
    return metrics.registry.get_sample_value("sink_delta_maintenance_total", {"step": step, "result": result}) or 0


def test_each_maintenance_step_is_counted_by_result():
    metrics = SinkMetrics()
    report = {"at_version": 100, "compact": {"numFilesAdded": 1, "numFilesRemoved": 97}, "cleanup_metadata": "done",
              "vacuum": "failed: a concurrent commit", "seconds": 0.8, "failed": ["vacuum"]}
    metrics.record_delta_maintenance(report)
    metrics.record_delta_maintenance({})  # a merge on a version that is not due
    assert _count(metrics, "compact", "ok") == 1
    assert _count(metrics, "cleanup_metadata", "ok") == 1
    assert _count(metrics, "vacuum", "failed") == 1
    assert _count(metrics, "vacuum", "ok") == 0
