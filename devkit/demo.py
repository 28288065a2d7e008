"""The quick-start demo: sample orders flow from a local broker through the service into a local
EMS-compatible endpoint, whose table ends up holding the latest version of every order.

`--format avro` produces the orders as Avro through a local schema registry (local_registry),
which the service reads them by.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devkit.brokers import free_port, running_broker
from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import ServiceProcess, wait_until
from local_ems.server import LocalEmsServer
from local_registry import LocalRegistry

REPO = Path(__file__).resolve().parents[1]
AUTHORIZATION = "AppKey demo-app-key"
ORDER_SCHEMA = {  # the fields devkit.kafka_data.produce_orders writes
    "type": "record", "name": "Order", "namespace": "demo", "fields": [
        {"name": "id", "type": "string"}, {"name": "version", "type": "int"},
        {"name": "status", "type": "string"}, {"name": "amount", "type": "double"},
        {"name": "customer", "type": "string"}, {"name": "note", "type": "string"},
    ],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=5000, help="distinct order ids")
    parser.add_argument("--updates", type=int, default=4, help="versions per order")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--format", choices=("json", "avro"), default="json",
                        help="how the orders are produced (avro: through a local schema registry)")
    parser.add_argument("--work-dir", type=Path, default=REPO / ".scratch" / "demo",
                        help="emptied and used for the endpoint's table, the service's scratch and log; "
                             "two demos at once need two")
    args = parser.parse_args()

    work = args.work_dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    topic, group, http_port = "orders", "demo-sink", free_port()
    print("1/5 starting a local Kafka-protocol broker (noida-db) ...", flush=True)
    with running_broker() as bootstrap, _value_format(args.format) as (serialize, format_env):
        endpoint = LocalEmsServer(work / "ems", AUTHORIZATION)
        endpoint.start()
        try:
            print(f"2/5 local EMS-compatible endpoint at {endpoint.items_url()}", flush=True)
            create_topics(bootstrap, {topic: args.partitions})
            workload = Workload()
            produced = produce_orders(bootstrap, topic, keys=args.keys, updates=args.updates, workload=workload,
                                      serialize=serialize)
            shown = " Avro" if args.format == "avro" else ""
            print(f"3/5 produced {produced}{shown} order events ({args.keys} orders x {args.updates} versions)",
                  flush=True)
            env = {
                "SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                "SINK_TOPICS": topic,
                "SINK_GROUP_ID": group,
                "SINK_EMS_ENDPOINT": endpoint.items_url(),
                "SINK_EMS_AUTHORIZATION": AUTHORIZATION,
                "SINK_EMS_TARGET_TABLE": "{topic}",
                "SINK_PRIMARY_KEYS": "id",
                "SINK_FLUSH_RECORDS": "5000",
                "SINK_FLUSH_INTERVAL_MS": "3000",
                "SINK_HTTP_PORT": str(http_port),
                "SINK_SCRATCH_DIR": str(work / "scratch"),
                **format_env,
            }
            service = ServiceProcess(env, work / "service.log").start()
            print(f"4/5 service started (pid {service.pid}); log: {service.log_path}", flush=True)
            expected = workload.expected_rows(topic)
            started = time.monotonic()
            try:
                wait_until(lambda: _matches(endpoint, topic, expected), 240, "the table to converge",
                           interval_s=1, process=service)
                ends = end_offsets(bootstrap, topic, args.partitions)
                wait_until(lambda: committed_offsets(bootstrap, group, topic, args.partitions) == ends, 60,
                           "offsets to be committed", process=service)
            finally:
                code = service.terminate()
            rows = endpoint.table(topic)
            uploads = endpoint.uploads(topic)
            print(f"5/5 done in {time.monotonic() - started:.1f}s: {len(uploads)} Parquet files pushed, "
                  f"table `{topic}` holds {len(rows)} rows = the latest version of each of {len(expected)} "
                  f"orders; committed offsets {committed_offsets(bootstrap, group, topic, args.partitions)} "
                  f"(end offsets {ends}); service exited with {code} after SIGTERM.", flush=True)
            return 0 if code == 0 else 1
        finally:
            endpoint.stop()


@contextlib.contextmanager
def _value_format(value_format: str) -> Iterator[tuple[Callable[[dict, str], bytes] | None, dict[str, str]]]:
    """How orders are serialized, and the service settings that read them; Avro runs a local registry."""
    if value_format == "json":
        yield None, {}
        return
    registry = LocalRegistry().start()
    try:
        print(f"    local schema registry at {registry.url}", flush=True)
        serializer = AvroSerializer(SchemaRegistryClient({"url": registry.url}), json.dumps(ORDER_SCHEMA))
        yield (lambda value, topic: serializer(value, SerializationContext(topic, MessageField.VALUE)),
               {"SINK_VALUE_FORMAT": "avro", "SINK_SCHEMA_REGISTRY_URL": registry.url})
    finally:
        registry.stop()


_last_seen: list[int] = [-1]


def _matches(endpoint: LocalEmsServer, topic: str, expected: dict[str, dict]) -> bool:
    rows = {row["id"]: row for row in endpoint.table(topic)}
    if len(rows) != _last_seen[0]:
        _last_seen[0] = len(rows)
        print(f"    endpoint table `{topic}`: {len(rows)}/{len(expected)} orders", flush=True)
    return len(rows) == len(expected) and all(
        rows[key]["version"] == value["version"] for key, value in expected.items()
    )


if __name__ == "__main__":
    sys.exit(main())
