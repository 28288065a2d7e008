"""CPU of one Spark task's work, without Spark: read a range, decode, write Parquet, upload to EMS.

    .venv/bin/python -m bench.task_speed [--records-per-task 12500] [--tasks 16] [--rounds 5]

A real broker (noida-db) holds one partition per task of exactly that many records (so a read
fetches only its range, as in a live run where a range ends near the log end), and the local EMS
endpoint runs as its own process, so only the task's CPU is counted. Each round runs every task in
this process as `python -m sink_service` would in a Python worker (`process_range`, the cached
consumer and HTTP session) and prints the main thread's CPU per task and per record, split into
reading (inside the read iterator), uploading (inside the target's `upload`) and the rest
(decoding, Parquet, compaction), and the wall time per task (waits on the broker and the endpoint included).
The first round warms imports and connections and is not printed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Producer

from bench.endpoint import endpoint_process
from bench.workload import WorkloadSpec, build_records
from devkit.brokers import running_broker
from devkit.kafka_data import create_topics
from sink_service.config.upload_targets import build_target
from sink_service.decode import DecodeSpec
from sink_service.task import range_reader
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.ranges import Range
from uploader.ems import EmsSettings
from uploader.target import UploadTarget

AUTHORIZATION = "AppKey task-speed"


class _Clock:
    """Main-thread CPU spent inside wrapped calls."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def iterate(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        while True:
            started = time.thread_time()
            batch = next(batches, None)
            self.seconds += time.thread_time() - started
            if batch is None:
                return
            yield batch

    def wrap(self, function):
        def timed(*args, **kwargs):
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - started
        return timed


def _produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    keys, values = build_records(WorkloadSpec(records=partitions * per_partition, partitions=partitions,
                                              keys=max(1, partitions * per_partition // 10), record_size=130))
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000})
    for n, (key, value) in enumerate(zip(keys, values, strict=True)):
        while True:
            try:
                producer.produce(topic, value, key, partition=n % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("records not acknowledged")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records-per-task", type=int, default=12_500, help="12,500: a live 20k/s run's file")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="task-speed-"))
    with endpoint_process(work / "ems", AUTHORIZATION) as endpoint, running_broker() as bootstrap:
        create_topics(bootstrap, {"orders": args.tasks})
        _produce(bootstrap, "orders", args.tasks, args.records_per_task)
        _run(args, bootstrap, endpoint.items_url(), work)


def _run(args: argparse.Namespace, bootstrap: str, items_url: str, work: Path) -> None:
    config = range_reader.consumer_config({"bootstrap.servers": bootstrap}, "task-speed")
    reading, uploading = _Clock(), _Clock()

    def timed_target(settings: EmsSettings) -> UploadTarget:
        target = build_target(settings)
        target.upload = uploading.wrap(target.upload)
        return target

    spec = TaskSpec(
        decode=DecodeSpec(None, ("id",), "_offset"),
        target_settings=EmsSettings(endpoint=items_url, authorization=AUTHORIZATION, client_id="task-speed"),
        build_target=timed_target, table_template="{topic}", scratch_dir=str(work / "scratch"),
        flush_bytes=64 << 20, flush_records=100_000, compression="snappy", error_policy="fail", compact_files=True,
    )

    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        return reading.iterate(range_reader.read_range(rng, config, 32 << 20))

    records = args.tasks * args.records_per_task
    for round_ in range(args.rounds + 1):
        reading.seconds = uploading.seconds = 0.0
        started, wall = time.thread_time(), time.monotonic()
        for partition in range(args.tasks):
            outcome = process_range(spec, Range("orders", partition, 0, args.records_per_task), read).to_pylist()[0]
            if outcome["status"] != "ok":
                raise RuntimeError(outcome["error"])
        total, wall = time.thread_time() - started, time.monotonic() - wall
        if round_ == 0:
            continue  # imports, connections, the consumer
        rest = total - reading.seconds - uploading.seconds
        print(f"round {round_}: {1000 * total / args.tasks:.1f} ms per task of {args.records_per_task:,} "
              f"({1e6 * total / records:.2f} us/record): read {1000 * reading.seconds / args.tasks:.1f} ms, "
              f"upload {1000 * uploading.seconds / args.tasks:.1f} ms, "
              f"decode+write {1000 * rest / args.tasks:.1f} ms; wall {1000 * wall / args.tasks:.1f} ms per task",
              flush=True)


if __name__ == "__main__":
    main()
