"""The source's planning with a scripted broker: ranges per batch, log ends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from sink_service.kafka_source.datasource import KafkaRangeStreamReader, PlannedRange, SourceOptions, bundle
from sink_service.kafka_source.positions import OffsetGapError
from sink_service.task.ranges import Range


class ScriptedKafka:
    """What the planner asks Kafka, answered from dictionaries the test changes."""

    def __init__(self, ends: dict[tuple[str, int], int]):
        self.ends = ends

    def latest(self, tps) -> dict[tuple[str, int], int]:
        return {tp: self.ends[tp] for tp in tps}

    def first_at_or_after(self, tps, when_ms: int) -> dict[tuple[str, int], tuple[int, int]]:
        return dict.fromkeys(tps, (0, int(time.time() * 1000)))  # every record written just now



def planner(tmp_path, kafka: ScriptedKafka) -> KafkaRangeStreamReader:
    options = SourceOptions(
        client_config={}, group_id="g",
        starting_positions={"orders": {"0": 0}}, flush_records=1000, flush_bytes=1 << 30,
        flush_interval_ms=60_000, max_files_per_batch=100, max_batch_records=800_000, executor_cores=100,
        retention_gap_policy="fail", read_batch_max_bytes=1 << 20,
        state_dir=str(tmp_path), task="",
    )
    reader = KafkaRangeStreamReader(options)
    reader._kafka()  # builds the admission; the admin client is replaced below
    reader._offsets = kafka
    return reader


def test_one_range_per_partition_per_batch(tmp_path):
    kafka = ScriptedKafka({("orders", 0): 10_000})
    reader = planner(tmp_path, kafka)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    [part] = reader.partitions(start, end)
    [planned] = part.ranges
    assert (planned.range.start, planned.range.end) == (0, 10_000)  # ten files' worth, uploaded in order by one task


def test_a_log_end_below_the_position_stops_the_query(tmp_path):
    kafka = ScriptedKafka({("orders", 0): 500})
    reader = planner(tmp_path, kafka)
    kafka.ends[("orders", 0)] = 20  # truncated, or deleted and recreated
    with pytest.raises(OffsetGapError, match="topic=orders partition=0: position 500 but the log ends at 20"):
        reader.latestOffset({"orders": {"0": 500}}, None)


def test_the_planning_processes_do_not_import_the_executor_side():
    # Spark starts a Python process per planning step before the first batch, each importing the
    # source module: decoding, Parquet and upload code there cost ~0.3 s and ~35 MB apiece.
    # Nor a Kafka client (~25 ms): only the streaming runner's process asks Kafka.
    probe = ("import sys, sink_service.kafka_source.datasource; "
             "print(sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('pyarrow', 'boto3', 'requests', 'confluent_kafka') "
             "or m.startswith(('sink_service.decode', 'sink_service.task.partition_task', 'uploader'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def _planned(*sizes: int) -> list[PlannedRange]:
    return [PlannedRange(Range("orders", p, 1000, 1000 + size)) for p, size in enumerate(sizes)]


def test_ranges_are_dealt_into_one_task_per_core_of_about_equal_records():
    tasks = bundle(_planned(100, 90, 60, 50, 1), 2)
    assert sorted(p.range.partition for task in tasks for p in task.ranges) == list(range(5))
    assert [sum(p.range.records for p in task.ranges) for task in tasks] == [151, 150]


def test_fewer_ranges_than_cores_keep_a_task_each():
    ranges = _planned(5, 7)
    assert [[p.range.partition for p in task.ranges] for task in bundle(ranges, 8)] == [[1], [0]]
    assert bundle([], 8) == []


def test_the_planner_process_logs_in_the_services_format_with_secrets_scrubbed():
    """Spark's streaming runner is a process of its own: its WARNINGs went out through Python's last-resort
    handler (no time, no level, no scrubber) and its INFO lines (Kafka retries) nowhere."""
    probe = textwrap.dedent("""
        import logging
        from sink_service.kafka_source.datasource import KafkaRangeStreamReader, SourceOptions
        options = SourceOptions(
            client_config={"bootstrap.servers": "127.0.0.1:1"}, group_id="g", starting_positions={},
            flush_records=1, flush_bytes=1, flush_interval_ms=1000, max_files_per_batch=1,
            max_batch_records=800_000, executor_cores=1,
            retention_gap_policy="fail", read_batch_max_bytes=1, state_dir="/tmp", task="",
            logging={"level": "INFO", "json_format": False, "secrets": ["hunter2-password"]})
        KafkaRangeStreamReader(SourceOptions.from_option(options.to_option()))._kafka()
        logging.getLogger("sink_service.kafka_source.offsets").info("asking again with hunter2-password")
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    [line] = [line for line in done.stderr.splitlines() if "asking again" in line]
    assert " INFO sink_service.kafka_source.offsets: asking again with " in line, line
    assert "hunter2-password" not in line, line
