"""A hand-written single-process Kafka -> Parquet -> EMS pipeline: how fast plain Python can go.

    python bench/systems/handwritten.py --bootstrap HOST:PORT --topic T --group G --endpoint URL --target T

confluent-kafka consumes in batches; each partition's values are appended to one newline-joined buffer; when
a partition holds --flush-records records, or its oldest pending record has waited --flush-interval-ms, the
buffer is parsed by `pyarrow.json.read_json`, Kafka metadata columns are added (`_partition`, `_offset`,
`_timestamp`), the table is written as one Parquet file, POSTed to the EMS endpoint (multipart, one part
`file`, the same contract as the service: primaryKeys, duplicateRemovalOrderColumn=_offset) and only then
that partition's offset is committed synchronously. No retries, no bad-record handling, no schema
evolution: a baseline, not a product. The Authorization header comes from EMS_AUTHORIZATION.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import time
from array import array

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
import requests
from confluent_kafka import Consumer, KafkaError, TopicPartition


class PartitionBuffer:
    __slots__ = ("first_at", "offsets", "timestamps", "values")

    def __init__(self) -> None:
        self.values = bytearray()
        self.offsets = array("q")
        self.timestamps = array("q")
        self.first_at = 0.0

    def __len__(self) -> int:
        return len(self.offsets)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--endpoint", required=True, help="EMS items URL")
    parser.add_argument("--target", required=True, help="EMS targetName")
    parser.add_argument("--primary-keys", default="id")
    parser.add_argument("--flush-records", type=int, default=250_000)
    parser.add_argument("--flush-interval-ms", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10_000, help="records per consume() call")
    args = parser.parse_args()

    stopping = False

    def stop(_signum, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
        # Some Kafka-protocol brokers (noida-db) answer a fetch with more than fetch.max.bytes; so does the service.
        "receive.message.max.bytes": 1_000_000_000,
        "queued.max.messages.kbytes": 256 << 10, "max.poll.interval.ms": 600_000,
    })
    consumer.subscribe([args.topic])
    session = requests.Session()
    params = {"targetName": args.target, "clientId": "bench-handwritten", "primaryKeys": args.primary_keys,
              "duplicateRemovalOrderColumn": "_offset"}
    headers = {"Authorization": os.environ["EMS_AUTHORIZATION"]}
    buffers: dict[int, PartitionBuffer] = {}
    interval_s = args.flush_interval_ms / 1000

    def flush(partition: int, buffer: PartitionBuffer) -> None:
        table = pj.read_json(io.BytesIO(buffer.values))
        n = len(buffer)
        table = table.append_column("_partition", pa.array(np.full(n, partition, np.int32)))
        table = table.append_column("_offset", pa.array(np.frombuffer(buffer.offsets, np.int64)))
        timestamps = pa.array(np.frombuffer(buffer.timestamps, np.int64)).cast(pa.timestamp("ms", "UTC"))
        table = table.append_column("_timestamp", timestamps)
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="snappy")
        first, last = buffer.offsets[0], buffer.offsets[-1]
        name = f"topic-{args.topic}_partition-{partition}_firstOffset-{first}_lastOffset-{last}.parquet"
        response = session.post(args.endpoint, params=params, headers=headers,
                                files={"file": (name, sink.getvalue(), "application/octet-stream")}, timeout=300)
        response.raise_for_status()
        consumer.commit(offsets=[TopicPartition(args.topic, partition, last + 1)], asynchronous=False)

    while not stopping:
        messages = consumer.consume(args.batch, timeout=0.5)
        now = time.monotonic()
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                print(f"consumer error: {error}", file=sys.stderr, flush=True)
                continue
            partition = message.partition()
            buffer = buffers.get(partition)
            if buffer is None:
                buffer = buffers[partition] = PartitionBuffer()
            if not buffer.offsets:
                buffer.first_at = now
            buffer.values += message.value()
            buffer.values.append(10)
            buffer.offsets.append(message.offset())
            buffer.timestamps.append(message.timestamp()[1])
            if len(buffer) >= args.flush_records:
                flush(partition, buffer)
                buffers[partition] = PartitionBuffer()
        for partition, buffer in list(buffers.items()):
            if buffer.offsets and now - buffer.first_at >= interval_s:
                flush(partition, buffer)
                buffers[partition] = PartitionBuffer()
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
