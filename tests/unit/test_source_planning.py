"""The source's planning with a scripted broker: partitions found while running, log ends."""

from __future__ import annotations

import itertools

import pytest

from sink_service.kafka_source.datasource import KafkaRangeStreamReader, SourceOptions
from sink_service.kafka_source.offsets import OffsetGapError


class ScriptedKafka:
    """What the planner asks Kafka, answered from dictionaries the test changes."""

    def __init__(self, ends: dict[tuple[str, int], int]):
        self.ends = ends
        self.resolved: list[list[tuple[str, int]]] = []

    def partitions(self, selection) -> list[tuple[str, int]]:
        return sorted(tp for tp in self.ends if selection.matches(tp[0]))

    def latest(self, tps) -> dict[tuple[str, int], int]:
        return {tp: self.ends[tp] for tp in tps}

    def resolve_start(self, tps, starting, gap_policy) -> dict[tuple[str, int], int]:
        assert starting == "earliest", "partitions found while running start at their earliest offset"
        self.resolved.append(list(tps))
        return dict.fromkeys(tps, 0)


def planner(tmp_path, kafka: ScriptedKafka) -> KafkaRangeStreamReader:
    options = SourceOptions(
        client_config={}, group_id="g", topics=(), topic_pattern="orders.*", starting_offsets="latest",
        starting_positions={"orders": {"0": 0}}, flush_records=1000, flush_bytes=1 << 30,
        flush_interval_ms=60_000, max_files_per_batch=100, first_batch_files=None,
        topic_refresh_interval_ms=1000, retention_gap_policy="fail", read_batch_max_bytes=1 << 20,
        state_dir=str(tmp_path), task="",
    )
    reader = KafkaRangeStreamReader(options)
    reader._kafka()  # builds the admission; the admin client is replaced below
    reader._offsets = kafka
    return reader


def covered(reader: KafkaRangeStreamReader, start: dict, end: dict) -> dict[tuple[str, int], list[tuple[int, int]]]:
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for part in reader.partitions(start, end):
        r = part.range
        spans.setdefault((r.topic, r.partition), []).append((r.start, r.end))
    return spans


def test_a_partition_found_while_running_is_read_from_its_start(tmp_path):
    kafka = ScriptedKafka({("orders", 0): 0})
    reader = planner(tmp_path, kafka)
    start = reader.initialOffset()
    # A new topic appears holding 4,000 records in each of three partitions.
    kafka.ends.update({("orders-eu", p): 4000 for p in range(3)})
    ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for _ in range(10):
        end = reader.latestOffset(start, None)
        for tp, spans in covered(reader, start, end).items():
            ranges.setdefault(tp, []).extend(spans)
        start = end
    assert kafka.resolved == [[("orders-eu", 0), ("orders-eu", 1), ("orders-eu", 2)]]
    for p in range(3):
        spans = ranges[("orders-eu", p)]
        assert spans[0][0] == 0, f"partition {p} starts at {spans[0][0]}, skipping what it held when found"
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
        assert spans[-1][1] == 4000


def test_one_range_per_partition_per_batch(tmp_path):
    kafka = ScriptedKafka({("orders", 0): 10_000})
    reader = planner(tmp_path, kafka)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    [part] = reader.partitions(start, end)
    assert (part.range.start, part.range.end) == (0, 10_000)  # ten files' worth, uploaded in order by one task


def test_a_log_end_below_the_position_stops_the_query(tmp_path):
    kafka = ScriptedKafka({("orders", 0): 500})
    reader = planner(tmp_path, kafka)
    kafka.ends[("orders", 0)] = 20  # truncated, or deleted and recreated
    with pytest.raises(OffsetGapError, match="topic=orders partition=0: position 500 but the log ends at 20"):
        reader.latestOffset({"orders": {"0": 500}}, None)
