"""A fixed-rate producer for the live mode, in its own process so its CPU is not charged to anyone.

    .venv/bin/python -m bench.live_producer --bootstrap HOST:PORT --rate 20000 --seconds 60 [--partitions 8 ...]

Builds the workload once (the same records for every system), prints `{"ready": true}`, then for every topic
name read from stdin produces all records to it at --rate records/s (paced every 5 ms, keyed, partitioned by
key, `linger.ms` 5), waits for every acknowledgement and prints one JSON line of statistics. The Kafka
timestamp of each record is the time `produce()` was called (CreateTime), so latency is measured from produce.
Exits at the end of stdin.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.workload import AckedProducer, WorkloadSpec, build_records

TICK_S = 0.005


def produce_at_rate(bootstrap: str, topic: str, keys: list[bytes], values: list[bytes], rate: float) -> dict:
    """Produce every record at `rate` records/s; returns timing statistics (wall times are time.time())."""
    acked = AckedProducer(bootstrap, **{"linger.ms": 5})
    producer, delivered = acked.producer, acked.delivered
    total, sent, behind = len(values), 0, 0
    put = producer.produce
    started_wall, started = time.time(), time.perf_counter()
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * rate) + 1)
        behind = max(behind, due - sent)
        while sent < due:
            try:
                put(topic, values[sent], keys[sent], on_delivery=delivered)
                sent += 1
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
        if sent < total:
            time.sleep(TICK_S)  # records go out in bursts of rate x 5 ms (100 at 20k/s)
    produced_s = time.perf_counter() - started
    acked.settle(120)
    return {"topic": topic, "records": total, "started_at": started_wall, "produce_s": produced_s,
            "acked_s": time.perf_counter() - started, "rate": total / produced_s,
            "max_behind_records": behind}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--rate", type=int, required=True, help="records per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=130)
    args = parser.parse_args()
    records = int(args.rate * args.seconds)
    spec = WorkloadSpec(records, args.partitions, min(args.keys, records), args.record_size)
    keys, values = build_records(spec)
    print(json.dumps({"ready": True, "records": records}), flush=True)
    for line in sys.stdin:
        topic = line.strip()
        if topic:
            print(json.dumps(produce_at_rate(args.bootstrap, topic, keys, values, args.rate)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
