"""Reading offset ranges from a real broker: exact coverage, bounded batches, no consumer left at the end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer

from bench.workload import WorkloadSpec, build_records, produce
from devkit.kafka_data import Workload, create_topics, produce_orders
from sink_service.config.upload_targets import build_target
from sink_service.decode import DecodeSpec
from sink_service.task import range_reader
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.range_reader import BATCH_RECORDS, _consumer, consumer_config, read_range
from sink_service.task.ranges import Range
from tests.support import kafka_wire
from uploader.directory import DirectorySettings
from uploader.retry import RetryPolicy

RECORDS = BATCH_RECORDS + 5_000  # one full batch, then a tail
MAX_BYTES = 1 << 30  # the record cap decides here


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
    assert _offsets(read_range(Range(topic, 0, 3_000, 24_000), config, MAX_BYTES)) == list(range(3_000, 24_000))
    assert _offsets(read_range(Range(topic, 0, 0, 10), config, MAX_BYTES)) == list(range(10))


def test_the_consumer_is_unassigned_before_the_last_batch_is_handed_on(bootstrap: str, topic: str):
    """The caller decodes, writes and uploads the last batch before the reader resumes; a consumer
    still assigned at the high watermark would keep fetching all that time."""
    config = consumer_config({"bootstrap.servers": bootstrap}, "range-reader-tail")
    consumer = _consumer(config)
    assigned_at_each_batch = []
    offsets: list[int] = []
    for batch in read_range(Range(topic, 0, 0, RECORDS), config, MAX_BYTES):
        assigned_at_each_batch.append(bool(consumer.assignment()))
        offsets += batch.column("offset").to_pylist()
    assert offsets == list(range(RECORDS))
    assert assigned_at_each_batch == [True, False]


LARGE_VALUE_BYTES = 1_000_000


@pytest.fixture(scope="module")
def large_values(bootstrap: str) -> str:
    """48 records of 1 MB each: a backlog the 20,000-record cap alone would read in one batch."""
    name = "range-reader-large"
    create_topics(bootstrap, {name: 1})
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 10_000_000})
    for n in range(48):
        filler = "x" * (LARGE_VALUE_BYTES - 40)
        producer.produce(name, key=str(n).encode(), value=json.dumps({"id": str(n), "blob": filler}).encode())
        producer.poll(0)
    producer.flush(30)
    return name


def test_read_batches_are_bounded_in_bytes(bootstrap: str, large_values: str):
    config = consumer_config({"bootstrap.servers": bootstrap}, "range-reader-bytes")
    batches = list(read_range(Range(large_values, 0, 0, 48), config, 4 * LARGE_VALUE_BYTES))
    assert _offsets(batches) == list(range(48))
    sizes = [sum(len(v) for v in b.column("value").to_pylist()) for b in batches]
    assert max(sizes) <= 4 * LARGE_VALUE_BYTES, sizes
    assert len(batches) >= 12


def _peak_arrow_memory(bootstrap: str, topic: str, records: int, tmp_path: Path) -> int:
    """Largest Arrow allocation seen at any batch boundary while a task decodes, writes, uploads."""
    config = consumer_config({"bootstrap.servers": bootstrap}, f"range-reader-memory-{records}")
    spec = TaskSpec(
        decode=DecodeSpec(None, ("id",), "_offset"),
        target_settings=DirectorySettings(path=str(tmp_path / f"out-{records}"), retry=RetryPolicy(max_elapsed_s=5)),
        build_target=build_target, table_template="{topic}", scratch_dir=str(tmp_path / "scratch"),
        flush_bytes=8 * LARGE_VALUE_BYTES, flush_records=100_000, compression="snappy", error_policy="fail",
    )
    peak = 0

    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        nonlocal peak
        for batch in read_range(rng, config, 4 * LARGE_VALUE_BYTES):
            peak = max(peak, pa.total_allocated_bytes())
            yield batch
            peak = max(peak, pa.total_allocated_bytes())

    outcome = process_range(spec, Range(topic, 0, 0, records), read).to_pylist()[0]
    assert outcome["status"] == "ok" and outcome["records_uploaded"] == records, outcome["error"]
    return peak


def test_task_memory_stays_flat_with_1mb_values(bootstrap: str, large_values: str, tmp_path: Path):
    baseline = pa.total_allocated_bytes()
    small = _peak_arrow_memory(bootstrap, large_values, 16, tmp_path) - baseline
    large = _peak_arrow_memory(bootstrap, large_values, 48, tmp_path) - baseline
    # Bounded by the read batch (4 MB) plus one row group (8 MB) and their decoded copies, not by
    # the 48 MB range: three times the records, about the same peak.
    assert large < 32 * LARGE_VALUE_BYTES, (small, large)
    assert large < small * 1.5 + 2 * LARGE_VALUE_BYTES, (small, large)


BACKLOG_RECORDS = 400_000
GROWTH_BOUND = 96 << 20
_READ_HALF_IN_A_FRESH_WORKER = """
import sys
from sink_service.task.ranges import Range
from sink_service.task.heap_release import resident_bytes
from sink_service.task.range_reader import consumer_config, read_range
bootstrap, topic, half = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = consumer_config({"bootstrap.servers": bootstrap}, "range-reader-heap")
for _ in read_range(Range(topic, 0, 0, 10), config, 1 << 30):  # imports, connection, consumer
    pass
before = resident_bytes()
for _ in read_range(Range(topic, 0, 0, half), config, 1 << 30):
    pass
print(resident_bytes() - before)
"""


def test_a_worker_gives_back_what_a_large_read_fetched(bootstrap: str):
    """noida-db answers the first fetch with the partition's whole backlog (400k records, ~200 MB in
    librdkafka). Once the range is read, a long-lived Python worker must not keep that memory: it
    would stay at its largest read forever and stack the next one on top (+166 MB before the trim)."""
    name = "range-reader-backlog"
    create_topics(bootstrap, {name: 1})
    keys, values = build_records(WorkloadSpec(records=BACKLOG_RECORDS, partitions=1))
    produce(bootstrap, name, keys, values)
    del keys, values
    worker = subprocess.run(
        [sys.executable, "-c", _READ_HALF_IN_A_FRESH_WORKER, bootstrap, name, str(BACKLOG_RECORDS // 2)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    growth = int(worker.stdout.split()[-1])
    assert growth < GROWTH_BOUND, f"the worker kept {growth >> 20} MB after the read"


@pytest.fixture
def paused_broker_topic(own_broker) -> Iterator[tuple]:
    create_topics(own_broker.bootstrap, {"silent": 2})
    for partition in (0, 1):
        produce_orders(own_broker.bootstrap, "silent", keys=1000, updates=1, workload=Workload(), partition=partition)
    config = consumer_config({"bootstrap.servers": own_broker.bootstrap}, "range-reader")
    yield own_broker, config
    range_reader._discard(config)


def _resume_once_replaced(broker, config: dict, before: object, replaced: threading.Event) -> None:
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            if range_reader._consumers.get(range_reader._key(config)) not in (None, before):
                replaced.set()
                return
            time.sleep(0.05)
    finally:
        broker.signal(signal.SIGCONT)


def test_a_consumer_silent_on_a_range_is_replaced_and_the_range_read_exactly(paused_broker_topic, monkeypatch,
                                                                              caplog):
    # librdkafka clients that lived through a broker restart were seen never to be answered again;
    # a range that has data but stays silent gets a new consumer, resuming where the old one was.
    broker, config = paused_broker_topic
    monkeypatch.setattr(range_reader, "RECONNECT_AFTER_S", 1.0)
    # The silent range is of a partition this consumer never fetched: nothing of it can be held by librdkafka,
    # only the broker can answer (reading on in the partition just read failed 2 times in ~30 suite runs: the
    # consumer was not replaced).
    assert _offsets(read_range(Range("silent", 0, 0, 500), config, MAX_BYTES)) == list(range(500))
    before = _consumer(config)
    # The broker resumes once the consumer is replaced, not on a timer: a timer of 3.5 s failed 2 times
    # in ~30 loaded suite runs with the consumer not replaced, which a reader thread held up for seconds
    # before its loop began would explain.
    replaced = threading.Event()
    broker.signal(signal.SIGSTOP)
    resume = threading.Thread(target=_resume_once_replaced, args=(broker, config, before, replaced))
    resume.start()
    try:
        assert _offsets(read_range(Range("silent", 1, 0, 500), config, MAX_BYTES)) == list(range(500))
    finally:
        resume.join()
    assert replaced.is_set(), "the consumer was not replaced within 20 s of the broker going silent"
    assert _consumer(config) is not before
    assert "partition=1 at offset 0" in caplog.text and "reconnecting" in caplog.text


def test_a_failed_read_leaves_no_cached_consumer_behind(paused_broker_topic):
    # The replay of the range must not inherit a consumer in whatever state made the read fail.
    _broker, config = paused_broker_topic
    assert _offsets(read_range(Range("silent", 0, 0, 10), config, MAX_BYTES)) == list(range(10))
    with pytest.raises(KafkaException, match="offset 5000"):
        list(read_range(Range("silent", 0, 5000, 5100), config, MAX_BYTES))  # past the log end
    assert range_reader._key(config) not in range_reader._consumers


# --- header names that are not UTF-8 ------------------------------------------------------------

BAD_NAME = b"\xffbad-name\xfe"  # what a Go or C producer may write; confluent-kafka reads names as str only


@pytest.fixture(scope="module")
def bad_header_name(bootstrap: str) -> Iterator[str]:
    """Six records written byte by byte (no Python client can write such a name); offset 3's headers
    hold a name that is not UTF-8."""
    name = "range-reader-header-names"
    create_topics(bootstrap, {name: 1})
    records = [(f"k{i}".encode(), json.dumps({"id": str(i), "version": i}).encode(),
                [(b"trace", b"t"), (BAD_NAME, b"x"), (b"after", b"y")] if i == 3 else [(b"trace", b"t")])
               for i in range(6)]
    assert kafka_wire.produce(bootstrap, name, 0, records) == 0
    yield name
    from sink_service.task import dead_letters  # cached per process: closed here, they do not outlive the broker

    for consumer in range_reader._consumers.values():
        consumer.close()
    range_reader._consumers.clear()
    for producer in dead_letters._producers.values():
        producer.flush(5)
    dead_letters._producers.clear()


def test_a_header_name_that_is_not_utf8_is_read_and_marked_not_a_failed_read(bootstrap: str, bad_header_name: str):
    config = consumer_config({"bootstrap.servers": bootstrap}, "range-reader-header-names")
    # Again and again: confluent-kafka hands back a broken list without raising once CPython has
    # specialised a warm `m.headers()` call, and touching it crashed the interpreter by the third read.
    for _ in range(30):
        batches = list(read_range(Range(bad_header_name, 0, 0, 6), config, MAX_BYTES))
        assert [h and h[0]["key"] for h in batches[0].column("headers").to_pylist()] == \
            ["trace", "trace", "trace", range_reader.UNREADABLE_HEADERS, "trace", "trace"]
    assert _offsets(batches) == list(range(6))
    [batch] = batches
    assert batch.column("key").to_pylist() == [f"k{i}".encode() for i in range(6)], "key and value are read"
    unreadable = range_reader.unreadable_headers(batch)
    assert list(unreadable) == [3]
    assert "not UTF-8" in unreadable[3] and repr(BAD_NAME) in unreadable[3], unreadable
    assert batch.column("headers")[0].as_py() == [{"key": "trace", "value": b"t"}], "the others keep their headers"


@pytest.mark.parametrize("policy", ["skip", "fail", "dlq"])
def test_a_header_name_that_is_not_utf8_is_a_bad_record_under_the_error_policy(
        bootstrap: str, bad_header_name: str, tmp_path: Path, policy: str):
    """Never a stall: the record is a bad record (topic, partition, offset named); the rest is uploaded."""
    from dataclasses import replace

    from sink_service.task.dead_letters import DeadLetterSpec
    from tests.component.task.test_dead_letters import dead_letter_records
    from tests.unit.task.test_partition_task import spec

    dlq = f"range-reader-header-names-dlq-{policy}"
    task = spec(tmp_path, policy, flush_records=2)
    if policy == "dlq":
        create_topics(bootstrap, {dlq: 1})
        task = replace(task, dead_letters=DeadLetterSpec.of(dlq, {"bootstrap.servers": bootstrap}))
    config = consumer_config({"bootstrap.servers": bootstrap}, "range-reader-header-names")
    outcome = process_range(task, Range(bad_header_name, 0, 0, 6),
                            lambda rng: read_range(rng, config, MAX_BYTES)).to_pylist()[0]
    where = f"topic={bad_header_name} partition=0 offset=3"
    assert outcome["error_kind"] != "read", outcome["error"]
    if policy == "fail":
        assert (outcome["status"], outcome["committable"], outcome["records_uploaded"]) == ("fatal", 3, 3)
        assert where in outcome["error"] and "header name" in outcome["error"], outcome["error"]
        return
    assert (outcome["status"], outcome["committable"], outcome["records_uploaded"]) == ("ok", 6, 5), outcome["error"]
    assert json.loads(outcome["bad_reasons"]) == {"invalid_header": 1}
    assert any(where in sample and "header name" in sample for sample in json.loads(outcome["bad_samples"]))
    if policy == "dlq":
        [letter] = dead_letter_records(bootstrap, dlq)
        named = dict(letter.headers())
        assert (letter.key(), letter.value()) == (b"k3", json.dumps({"id": "3", "version": 3}).encode())
        assert (named["sink.error.kind"], named["sink.source.offset"]) == (b"invalid_header", b"3")
        assert b"not UTF-8" in named["sink.error.message"]
