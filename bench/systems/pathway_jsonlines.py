"""Pathway (Rust engine, Python API) as a peer: Kafka reader into a JSON Lines file, nothing else.

    bench/.venv-pathway/bin/python bench/systems/pathway_jsonlines.py --bootstrap HOST:PORT --topic T \
        --group G --out FILE [--autocommit-ms 1500]

Runs in its own virtualenv (bench/.venv-pathway, from bench/requirements-pathway.txt). `pw.io.kafka.read`
decodes the JSON values against a schema of the workload's fields (live mode adds the `_metadata` column:
partition, offset, Kafka timestamp, for produce-to-write latency); `pw.io.jsonlines.write`
appends one line per record to --out (Delta Lake, Pathway's Parquet sink, needs a license key: not used).
No primary key: the table is append-only, so every record becomes one line (diff = 1); nothing is upserted
and nothing is pushed anywhere.

Offsets: Pathway's Kafka reader leaves librdkafka's auto-commit on (`enable.auto.commit`), so the group's
offsets follow what was *read*, every auto.commit.interval.ms, not what was written; the benchmark therefore
judges completion by the lines in --out, not by the group's offsets. SIGTERM stops the process.
"""

from __future__ import annotations

import argparse
import sys

import pathway as pw


class Order(pw.Schema):
    """The workload's value (bench/workload.py): one JSON object per record."""

    id: str
    version: int
    status: str
    amount: float
    customer: str
    note: str


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True, help="JSON Lines file to write")
    parser.add_argument("--with-metadata", action="store_true",
                        help="add the `_metadata` column (Kafka timestamp, partition, offset) for latency; it costs "
                             "Pathway a JSON object per record, so a backlog run (no need for it) leaves it off")
    parser.add_argument("--autocommit-ms", type=int, default=1500,
                        help="autocommit_duration_ms: the longest time read data waits before it is pushed "
                             "through the engine into the file (Pathway's default: 1500)")
    args = parser.parse_args()

    settings = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        # Some Kafka-protocol brokers (noida-db) answer a fetch with more than fetch.max.bytes (the other systems
        # set the same).
        "receive.message.max.bytes": "1000000000",
    }
    table = pw.io.kafka.read(settings, topic=args.topic, format="json", schema=Order,
                             autocommit_duration_ms=args.autocommit_ms, with_metadata=args.with_metadata)
    pw.io.jsonlines.write(table, args.out)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
