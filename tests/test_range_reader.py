"""Reading offset ranges from a real broker: exact coverage, and no consumer left at the high watermark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devkit.kafka_data import Workload, create_topics, produce_orders
from sink_service.kafka_source import range_reader
from sink_service.kafka_source.admission import Range
from sink_service.kafka_source.range_reader import BATCH_RECORDS, _consumer, consumer_config, read_range

RECORDS = BATCH_RECORDS + 5_000  # one full batch, then a tail


@pytest.fixture(scope="module")
def topic(bootstrap: str) -> Iterator[str]:
    name = "range-reader"
    create_topics(bootstrap, {name: 1})
    produce_orders(bootstrap, name, keys=RECORDS, updates=1, workload=Workload(), partition=0)
    yield name
    # The reader caches its consumers per process; closed here, they do not outlive the broker.
    for consumer in range_reader._consumers.values():
        consumer.close()
    range_reader._consumers.clear()


def _offsets(batches) -> list[int]:
    return [offset for batch in batches for offset in batch.column("offset").to_pylist()]


def test_a_range_is_read_exactly(bootstrap: str, topic: str):
    config = consumer_config({"bootstrap.servers": bootstrap}, "range-reader-exact")
    assert _offsets(read_range(Range(topic, 0, 3_000, 24_000), config)) == list(range(3_000, 24_000))
    assert _offsets(read_range(Range(topic, 0, 0, 10), config)) == list(range(10))


def test_the_consumer_is_unassigned_before_the_last_batch_is_handed_on(bootstrap: str, topic: str):
    """The caller decodes, writes and uploads the last batch before the reader resumes; a consumer
    still assigned at the high watermark would keep fetching all that time."""
    config = consumer_config({"bootstrap.servers": bootstrap}, "range-reader-tail")
    consumer = _consumer(config)
    assigned_at_each_batch = []
    offsets: list[int] = []
    for batch in read_range(Range(topic, 0, 0, RECORDS), config):
        assigned_at_each_batch.append(bool(consumer.assignment()))
        offsets += batch.column("offset").to_pylist()
    assert offsets == list(range(RECORDS))
    assert assigned_at_each_batch == [True, False]
