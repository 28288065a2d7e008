"""A worker's next range is not held up by the fetch its last range left at the log end.

Apache Kafka holds a fetch at the log end for up to the consumer's `fetch.wait.max.ms` (librdkafka: 500 ms by
default), and a consumer has one fetch in flight per broker. A range read to the log end leaves such a fetch
behind, so the cached consumer's next range (the next range of a task, or of any later task in the worker)
waited for it: up to half a second per range, which at 96 partitions set the pace of a whole micro-batch.
noida-db answers every fetch at once and never showed it; tansu holds fetches as Kafka does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bench.workload import WorkloadSpec, build_records, produce, produce_trailers
from devkit.brokers import running_broker
from devkit.kafka_data import create_topics, end_offsets
from sink_service.task import range_reader
from sink_service.task.range_reader import consumer_config, read_groups, read_range
from sink_service.task.ranges import Range

PARTITIONS = 4
RECORDS = 8_000  # 2,000 a partition: ranges the joint fetch takes together


@pytest.fixture(scope="module")
def holding_broker() -> Iterator[tuple[str, dict[int, int]]]:
    """tansu with a topic whose reported ends are the true ends (its watermark counts batches: a trailer)."""
    with running_broker("tansu") as bootstrap:
        create_topics(bootstrap, {"held": PARTITIONS})
        spec = WorkloadSpec(records=RECORDS, partitions=PARTITIONS, keys=RECORDS)
        produce(bootstrap, "held", *build_records(spec))
        ends = produce_trailers(bootstrap, "held", PARTITIONS, spec.record_size).ends
        assert end_offsets(bootstrap, "held", PARTITIONS) == ends
        try:
            yield bootstrap, ends
        finally:
            for consumer in range_reader._consumers.values():
                consumer.close()
            range_reader._consumers.clear()


def _fastest_of_three(read) -> float:
    """The least of three reads' times: each read starts right after one that ended at the log end."""
    times = []
    for _ in range(3):
        started = time.monotonic()
        read()
        times.append(time.monotonic() - started)
    return min(times)


def test_a_range_after_one_read_to_the_log_end_is_not_held_up(holding_broker):
    bootstrap, ends = holding_broker
    config = consumer_config({"bootstrap.servers": bootstrap}, "held-alone")
    whole = Range("held", 0, 0, ends[0])
    assert sum(batch.num_rows for batch in read_range(whole, config, 32 << 20)) == ends[0]

    def read() -> None:
        assert sum(batch.num_rows for batch in read_range(whole, config, 32 << 20)) == ends[0]

    # Held, the next read took 0.49-0.50 s here (the broker's 500 ms); now 0.04-0.07 s.
    assert _fastest_of_three(read) < 0.3


def test_ranges_read_together_after_a_joint_read_to_the_log_end_are_not_held_up(holding_broker):
    bootstrap, ends = holding_broker
    config = consumer_config({"bootstrap.servers": bootstrap}, "held-together")
    ranges = [Range("held", p, 0, ends[p]) for p in range(PARTITIONS)]

    def read() -> None:
        [group] = list(read_groups(ranges, config, 32 << 20))  # one joint fetch of all four
        assert {rng: sum(b.num_rows for b in reader(rng)) for rng, reader in group} == \
            {rng: rng.records for rng in ranges}

    read()
    assert _fastest_of_three(read) < 0.3
