"""Delta table maintenance, run by the task whose merge committed a due version, counted on the driver."""

from __future__ import annotations

from types import SimpleNamespace

from sink_service.driver.metrics import SinkMetrics
from sink_service.task.partition_task import _Outcome


def _row(files: list[dict]) -> SimpleNamespace:
    batch = _Outcome(topic="orders", partition=0, range_start=0, range_end=100, committable=100, files=files).to_batch()
    return SimpleNamespace(**batch.to_pylist()[0])


def _count(metrics: SinkMetrics, step: str, result: str) -> float:
    return metrics.registry.get_sample_value("sink_delta_maintenance_total", {"step": step, "result": result}) or 0


def test_each_maintenance_step_is_counted_by_result():
    metrics = SinkMetrics()
    report = {"at_version": 100, "compact": {"numFilesAdded": 1, "numFilesRemoved": 97}, "cleanup_metadata": "done",
              "vacuum": "failed: a concurrent commit", "seconds": 0.8, "failed": ["vacuum"]}
    metrics.record_outcome(_row([
        {"parked": None, "bytes": 10, "duration_s": 0.1, "records": 5, "maintenance": report},
        {"parked": None, "bytes": 10, "duration_s": 0.1, "records": 5, "maintenance": None},  # not a due version
    ]), "delta", {})
    assert _count(metrics, "compact", "ok") == 1
    assert _count(metrics, "cleanup_metadata", "ok") == 1
    assert _count(metrics, "vacuum", "failed") == 1
    assert _count(metrics, "vacuum", "ok") == 0
