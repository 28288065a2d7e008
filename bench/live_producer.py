"""A fixed-rate producer for the live mode, in its own process so its CPU is not charged to anyone.

    .venv/bin/python -m bench.live_producer --bootstrap HOST:PORT --rate 20000 --seconds 60 [--partitions 8 ...]

Prints `{"ready": true}`, then for every topic name read from stdin produces the workload's records to it at
--rate records/s (paced every 5 ms, keyed, partitioned by key, `linger.ms` 5), waits for every acknowledgement
and prints one JSON line of statistics. Records are made as they go out, the same for every system: 30 minutes
at 20k/s would be 36M records to hold up front. The Kafka
timestamp of each record is the time `produce()` was called (CreateTime), so latency is measured from produce.
Exits at the end of stdin.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.workload import AckedProducer, WorkloadSpec, iter_records

TICK_S = 0.005


def produce_at_rate(bootstrap: str, topic: str, spec: WorkloadSpec, rate: float) -> dict:
    """Produce every record at `rate` records/s; returns timing statistics (wall times are time.time())."""
    acked = AckedProducer(bootstrap, **{"linger.ms": 5})
    producer = acked.producer
    records = iter_records(spec)
    total, sent, behind = spec.records, 0, 0
    started_wall, started = time.time(), time.perf_counter()
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * rate) + 1)
        behind = max(behind, due - sent)
        while sent < due:
            key, value = next(records)
            acked.send(topic, key, value, 0.01)
            sent += 1
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
    next(iter_records(spec))  # a spec the workload cannot make fails here, before anything is produced
    print(json.dumps({"ready": True, "records": records}), flush=True)
    for line in sys.stdin:
        topic = line.strip()
        if topic:
            print(json.dumps(produce_at_rate(args.bootstrap, topic, spec, args.rate)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
