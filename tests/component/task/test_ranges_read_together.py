"""A task's small ranges fetched together from one assignment (`read_groups`), against a real broker."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, Producer

from devkit.kafka_data import create_topics
from sink_service.config.upload_targets import build_target
from sink_service.kafka_source.datasource import (
    RANGES_IN_FLIGHT,
    KafkaRangePartition,
    KafkaRangeStreamReader,
    PlannedRange,
    SourceOptions,
)
from sink_service.task import range_reader
from sink_service.task.partition_task import TaskSpec
from sink_service.task.range_reader import GROUP_RECORDS, consumer_config, read_groups
from sink_service.task.ranges import Range
from tests.unit.task.test_partition_task import spec

PARTITIONS = 6
PER_PARTITION = 3_000
MAX_BYTES = 1 << 30


@pytest.fixture(scope="module")
def topic(bootstrap: str) -> Iterator[str]:
    name = "ranges-together"
    create_topics(bootstrap, {name: PARTITIONS})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for partition in range(PARTITIONS):
        for n in range(PER_PARTITION):
            producer.produce(name, json.dumps({"id": f"{partition}-{n}", "pad": "x" * 100}).encode(),
                             f"{partition}-{n}".encode(), partition=partition)
            producer.poll(0)
    assert producer.flush(60) == 0
    yield name
    for consumer in range_reader._consumers.values():  # cached per process: closed before the broker
        consumer.close()
    range_reader._consumers.clear()


class CountingConsumer(Consumer):
    """A consumer that notes every assignment it is given."""

    assigned: list[list[tuple[str, int, int]]]

    def assign(self, partitions) -> None:
        CountingConsumer.assigned.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])
        super().assign(partitions)


@pytest.fixture
def assigns(monkeypatch) -> list[list[tuple[str, int, int]]]:
    """The assignments of the consumers `range_reader` makes during the test."""
    real = range_reader.new_client
    monkeypatch.setattr(range_reader, "new_client", lambda _cls, config: real(CountingConsumer, config))
    CountingConsumer.assigned = []
    return CountingConsumer.assigned


def _offsets(batches: Iterator[pa.RecordBatch]) -> list[int]:
    return [offset for batch in batches for offset in batch.column("offset").to_pylist()]


def _read_all(ranges: list[Range], config, max_bytes: int = MAX_BYTES) -> dict[Range, list[int]]:
    return {rng: _offsets(read(rng)) for group in read_groups(ranges, config, max_bytes) for rng, read in group}


def test_small_ranges_are_fetched_with_one_assignment_and_read_exactly(bootstrap: str, topic: str, assigns):
    """Old code (a `read_range` per range): one assign per range, each paying a fetch round trip."""
    config = consumer_config({"bootstrap.servers": bootstrap}, "together-exact")
    ranges = [Range(topic, p, 100 * p, 100 * p + 1_000 + p) for p in range(PARTITIONS)]
    assert _read_all(ranges, config) == {rng: list(range(rng.start, rng.end)) for rng in ranges}
    assert assigns == [[(topic, p, 100 * p) for p in range(PARTITIONS)]]


def test_ranges_are_given_in_order_and_grouped_up_to_the_record_budget(bootstrap: str, topic: str, assigns):
    config = consumer_config({"bootstrap.servers": bootstrap}, "together-groups")
    big = Range(topic, 0, 0, PER_PARTITION)
    small = [Range(topic, p, 0, 50) for p in range(1, PARTITIONS)]
    ranges = [big, *small]
    given = [rng for group in read_groups(ranges, config, MAX_BYTES) for rng, _read in group]
    assert given == ranges
    assert range_reader._groups(ranges) == [ranges]  # 3,250 records: one group
    assert [len(g) for g in range_reader._groups([Range(topic, p, 0, GROUP_RECORDS // 2 + 1)
                                                  for p in range(3)])] == [1, 1, 1]
    assert [len(g) for g in range_reader._groups([Range(topic, 0, 0, GROUP_RECORDS + 1),
                                                  *small])] == [1, len(small)]


def test_a_fetch_past_the_byte_bound_stops_and_each_range_is_finished_alone(bootstrap: str, topic: str, assigns):
    """Never more than one read batch's bytes held: what the joint fetch leaves is read by `read_range`."""
    config = consumer_config({"bootstrap.servers": bootstrap}, "together-bytes")
    ranges = [Range(topic, p, 0, 1_500) for p in range(4)]
    bound = 200_000  # the four ranges hold ~800 kB of keys and values
    fetched = range_reader._fetch_together(ranges, config, bound)
    held = 0
    for rng, (batch, reached) in fetched.items():
        offsets = batch.column("offset").to_pylist() if batch is not None else []
        assert offsets == list(range(rng.start, reached)), "a prefix of the range, nothing skipped"
        if batch is not None:
            held += sum(len(v) + len(k) for v, k in zip(batch.column("value").to_pylist(),
                                                        batch.column("key").to_pylist(), strict=True))
    assert 0 < held <= bound
    assert any(reached < rng.end for rng, (_batch, reached) in fetched.items())
    assert _read_all(ranges, config, bound) == {rng: list(range(0, 1_500)) for rng in ranges}
    assert len(assigns) > 2, "ranges left unfinished are read alone"


def test_a_range_that_cannot_be_read_fails_alone_and_the_others_are_read(bootstrap: str, topic: str, assigns):
    config = consumer_config({"bootstrap.servers": bootstrap}, "together-error")
    good = [Range(topic, p, 0, 200) for p in range(3)]
    beyond = Range(topic, 3, PER_PARTITION + 5_000, PER_PARTITION + 5_100)  # past the log end
    outcomes = {}
    for rng, read in (pair for group in read_groups([*good, beyond], config, MAX_BYTES) for pair in group):
        try:
            outcomes[rng] = _offsets(read(rng))
        except KafkaException as exc:
            outcomes[rng] = str(exc)
    assert {rng: outcomes[rng] for rng in good} == {rng: list(range(200)) for rng in good}
    assert f"offset {PER_PARTITION + 5_000}" in outcomes[beyond], outcomes[beyond]


def test_a_range_read_again_after_a_failed_write_is_read_from_kafka(bootstrap: str, topic: str, assigns,
                                                                    tmp_path: Path):
    """`process_range` reads what is left of a range again after an error it blames on the records."""
    config = consumer_config({"bootstrap.servers": bootstrap}, "together-again")
    ranges = [Range(topic, p, 0, 300) for p in range(2)]
    for rng, read in (pair for group in read_groups(ranges, config, MAX_BYTES) for pair in group):
        assert _offsets(read(rng)) == list(range(300))
        rest = Range(rng.topic, rng.partition, 120, 300)
        assert _offsets(read(rest)) == list(range(120, 300))
        assert _offsets(read(rng)) == list(range(300)), "the same range again: read from Kafka"


def test_a_task_reads_its_ranges_together_and_uploads_each_partitions_files_in_order(
        bootstrap: str, topic: str, assigns, tmp_path: Path):
    """The source's `read`: one outcome per range, every offset uploaded, each partition's files in
    offset order; its small ranges fetched from one assignment (old code: one assign per range)."""
    ranges = [Range(topic, p, 10, 1_010 + 100 * p) for p in range(PARTITIONS)]
    outcomes = _task_outcomes(bootstrap, "together-task", ranges, spec(tmp_path, "fail", flush_records=400), tmp_path)
    assert [(o["partition"], o["status"], o["committable"]) for o in outcomes] == \
        [(rng.partition, "ok", rng.end) for rng in ranges]
    for outcome, rng in zip(outcomes, ranges, strict=True):
        files = [(f["first_offset"], f["last_offset"]) for f in json.loads(outcome["files"])]
        assert files[0][0] == rng.start and files[-1][1] == rng.end - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(files)), files
        assert len(files) == -(-rng.records // 400)
    assert assigns == [[(topic, p, 10) for p in range(PARTITIONS)]]


@dataclass(frozen=True)
class _Built:
    """A recipe whose spec is built already: the test's spec writes where the test says."""

    spec: TaskSpec

    def build(self) -> TaskSpec:
        return self.spec


def _task_outcomes(bootstrap: str, group: str, ranges: list[Range], task: TaskSpec, tmp_path: Path) -> list[dict]:
    options = SourceOptions(
        client_config={"bootstrap.servers": bootstrap}, group_id=group, starting_positions={},
        flush_records=task.flush_records, flush_bytes=1 << 30, flush_interval_ms=1000, max_files_per_batch=8,
        max_batch_records=800_000,
        executor_cores=1, retention_gap_policy="fail", read_batch_max_bytes=MAX_BYTES, state_dir=str(tmp_path),
        task=SourceOptions.pack_task(_Built(task)),
    )
    return [row for batch in KafkaRangeStreamReader(options).read(
        KafkaRangePartition([PlannedRange(rng) for rng in ranges])) for row in batch.to_pylist()]


UPLOAD_S = 0.2
uploads: list[tuple[int, int, float, float]] = []  # (partition, first offset, started, finished)
_uploads_lock = threading.Lock()


def slow_target(settings):
    """The directory target, each upload taking `UPLOAD_S` (an endpoint's own time), noted."""
    target = build_target(settings)
    upload = target.upload

    def slow(path, metadata, **kwargs):
        started = time.monotonic()
        time.sleep(UPLOAD_S)
        receipt = upload(path, metadata, **kwargs)
        with _uploads_lock:
            uploads.append((metadata.partition, metadata.first_offset, started, time.monotonic()))
        return receipt

    target.upload = slow
    return target


def test_a_tasks_small_ranges_wait_for_their_uploads_side_by_side_each_partition_in_order(
        bootstrap: str, topic: str, tmp_path: Path):
    """Old code: one range after another, so a task of six one-file ranges took six uploads' time."""
    from dataclasses import replace

    uploads.clear()
    ranges = [Range(topic, p, 2_000, 2_300) for p in range(PARTITIONS)]  # 2 files each
    task = replace(spec(tmp_path, "fail", flush_records=150), build_target=slow_target)
    started = time.monotonic()
    outcomes = _task_outcomes(bootstrap, "together-slow", ranges, task, tmp_path)
    took = time.monotonic() - started
    assert [(o["partition"], o["status"], o["committable"]) for o in outcomes] == \
        [(p, "ok", 2_300) for p in range(PARTITIONS)]
    assert len(uploads) == 2 * PARTITIONS
    assert took < 2 * PARTITIONS * UPLOAD_S * 0.75, took
    events = sorted([(t0, 1) for _p, _o, t0, _t1 in uploads] + [(t1, -1) for _p, _o, _t0, t1 in uploads])
    at_once = max(itertools.accumulate(delta for _t, delta in events))
    assert 1 < at_once <= RANGES_IN_FLIGHT
    for partition in range(PARTITIONS):
        own = sorted((t0, t1, first) for p, first, t0, t1 in uploads if p == partition)
        assert own[0][1] <= own[1][0], "a partition's files one at a time"
        assert [first for _t0, _t1, first in own] == [2_000, 2_150], "in offset order"
