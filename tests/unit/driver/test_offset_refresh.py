"""The offset monitor's refresh against a query restart: the gauges of a partition given up stay gone."""

from __future__ import annotations

from pathlib import Path

from sink_service.driver.backlog import BacklogProgress
from sink_service.driver.health import Health
from sink_service.driver.metrics import SinkMetrics
from sink_service.driver.offset_commit import ContiguousCommits
from sink_service.driver.pipeline import Pipeline

TP = ("orders", 0)


def _lag(metrics: SinkMetrics) -> float | None:
    return metrics.registry.get_sample_value("sink_consumer_lag_records", {"topic": "orders", "partition": "0"})


def _pipeline(tmp_path: Path, kafka: object) -> Pipeline:
    """Only what `refresh_offset_metrics` reads: no Spark, no broker."""
    pipeline = Pipeline.__new__(Pipeline)
    pipeline._commits = ContiguousCommits({TP: 100})
    pipeline.metrics, pipeline.health, pipeline.kafka = SinkMetrics(), Health(), kafka
    pipeline._backlog = BacklogProgress(caught_up_records=1000)
    pipeline.state_dir = tmp_path
    return pipeline


def test_a_refresh_records_lag_for_the_partitions_of_the_running_query(tmp_path):
    class Kafka:
        def latest(self, tps):
            return dict.fromkeys(tps, 500)

        def committed(self, tps):
            return dict.fromkeys(tps, 100)

    pipeline = _pipeline(tmp_path, Kafka())
    pipeline.refresh_offset_metrics()
    assert _lag(pipeline.metrics) == 400


def test_a_refresh_that_straddles_a_restart_on_another_assignment_records_nothing(tmp_path):
    """The monitor asked with the old assignment's positions; meanwhile the group took the partition
    away and the query restarted without it (a standby), dropping its gauges. The answer arriving
    after that must not put them back: a standby reported lag for a partition it did not own."""

    class Kafka:
        def latest(self, tps):
            pipeline.start_restart()
            return dict.fromkeys(tps, 500)

        def committed(self, tps):
            return dict.fromkeys(tps, 100)

    pipeline = _pipeline(tmp_path, Kafka())
    pipeline.metrics.record_lag({TP: 100}, {TP: 400})  # what the last refresh of the old query recorded

    def start_restart() -> None:  # start_query's first steps: forget the old positions, drop the gauges
        pipeline._commits = None
        pipeline.metrics.keep_partitions(frozenset())

    pipeline.start_restart = start_restart
    pipeline.refresh_offset_metrics()
    assert _lag(pipeline.metrics) is None
