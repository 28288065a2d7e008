"""What the test broker itself costs while a system runs: idle, reading a topic, and committing offsets.

    .venv/bin/python -m bench.broker_cost [--records 1000000] [--partitions 96] [--seconds 20]

Starts a broker (noida-db unless `SINK_TEST_BROKER` says otherwise), produces the benchmark's workload, waits
for the broker to settle, then prints the broker's CPU seconds in each phase: nothing connected; one consumer
reading the whole topic; and one offset commit every 2 s (nothing read). On noida-db the last one is the
"broker" column of a benchmark run: it saves its whole state after commits (bench/README.md, *Caveats*).
"""

from __future__ import annotations

import argparse
import time

import psutil
from confluent_kafka import Consumer, TopicPartition

from bench.measure import cpu_seconds, wait_until_quiet
from bench.run import produce_workload, stop_leftovers
from bench.workload import WorkloadSpec
from devkit.brokers import running_broker

TOPIC = "broker_cost"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=96)
    parser.add_argument("--seconds", type=float, default=20, help="length of the idle and the commit phases")
    args = parser.parse_args()
    broker: list[psutil.Process] = []
    try:
        with running_broker() as bootstrap:
            broker = psutil.Process().children(recursive=True)
            measure(bootstrap, broker, args)
    finally:
        stop_leftovers(broker)


def measure(bootstrap: str, broker: list[psutil.Process], args: argparse.Namespace) -> None:
    def cpu_s() -> float:
        return sum(cpu_seconds(p) for p in broker)

    produced = produce_workload(bootstrap, WorkloadSpec(records=args.records, partitions=args.partitions), TOPIC)
    wait_until_quiet(0.15, 120)

    def phase(name: str, work) -> None:
        before, started = cpu_s(), time.monotonic()
        work()
        wall = time.monotonic() - started
        used = cpu_s() - before
        print(f"{name:<32} {wall:6.1f} s wall, broker {used:6.2f} CPU-s ({used / wall:.2f} cores)", flush=True)

    def read_all() -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "broker-cost-read",
                             "enable.auto.commit": False, "receive.message.max.bytes": 1_000_000_000})
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in produced.end_offsets])
        read = 0
        while read < produced.records:
            read += len(consumer.consume(20_000, 1.0))
        consumer.close()

    def commit_every_2s() -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "broker-cost-commits",
                             "enable.auto.commit": False})
        for n in range(int(args.seconds // 2)):
            consumer.commit(offsets=[TopicPartition(TOPIC, n % args.partitions, n + 1)], asynchronous=False)
            time.sleep(2)
        consumer.close()

    phase("idle", lambda: time.sleep(args.seconds))
    phase("one consumer reads the topic", read_all)
    wait_until_quiet(0.15, 120)
    phase("one commit every 2 s", commit_every_2s)


if __name__ == "__main__":
    main()
