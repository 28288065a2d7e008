"""SINK_TRANSFORM_SQL against a real broker and local_ems: rename, filter and cast; commits and file
boundaries are those the service makes without a transform."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from devkit.kafka_data import create_topics
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed, scrape_metrics, uploaded_ranges

pytestmark = pytest.mark.e2e

COMMIT_BOUND_S = 40
PARTITIONS, PER_PARTITION, FLUSH_RECORDS = 3, 300, 100
SQL = ("SELECT CAST(id AS STRING) AS order_id, CAST(amount AS INT) AS amount, upper(status) AS status "
       "FROM records WHERE status <> 'test'")


def _order(n: int) -> dict:
    return {"id": n, "amount": str(n * 10), "status": "test" if n % 4 == 0 else "paid"}


def test_a_transform_renames_filters_and_casts_and_every_partition_commits_to_its_end(
        bootstrap, ems, unique, service_env, services):
    topic, group = unique("transform"), unique("group")
    create_topics(bootstrap, {topic: PARTITIONS})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    orders = range(PARTITIONS * PER_PARTITION)
    for n in orders:  # order n is offset n // 3 of partition n % 3
        producer.produce(topic, key=str(n).encode(), value=json.dumps(_order(n)).encode(), partition=n % PARTITIONS)
    producer.flush(30)

    env = service_env(topic, group, SINK_TRANSFORM_SQL=SQL, SINK_PRIMARY_KEYS="order_id",
                      SINK_FLUSH_RECORDS=FLUSH_RECORDS)
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, PARTITIONS), COMMIT_BOUND_S,
               "every partition committed to its end offset", process=service)
    metrics = scrape_metrics(int(env["SINK_HTTP_PORT"]))
    assert service.terminate() == 0

    kept = [n for n in orders if _order(n)["status"] != "test"]
    rows = {row["order_id"]: row for row in ems.table(topic)}
    assert rows == {str(n): {"order_id": str(n), "amount": n * 10, "status": "PAID", "_offset": n // PARTITIONS}
                    for n in kept}
    uploads = ems.uploads(topic)
    assert {(u["params"]["primaryKeys"], u["params"]["duplicateRemovalOrderColumn"]) for u in uploads} == {
        ("order_id", "_offset")}
    # Files roll on SINK_FLUSH_RECORDS rows as without a transform (records the WHERE drops are not
    # rows, like skipped bad records): ranges are admitted by records read, so each partition's 300
    # records give 3 files here whichever way they were split into ranges; none is uploaded twice.
    for p, spans in uploaded_ranges(ems, topic).items():
        assert len(spans) == len(set(spans)) == -(-PER_PARTITION // FLUSH_RECORDS), (p, spans)
        kept_offsets = [o for o in range(PER_PARTITION) if (o * PARTITIONS + p) % 4]
        in_files = [o for first, last in sorted(spans) for o in kept_offsets if first <= o <= last]
        assert in_files == kept_offsets, f"partition {p}: files {sorted(spans)} overlap or miss rows"
    assert all(u["rows"] <= FLUSH_RECORDS for u in uploads)
    assert sum(u["rows"] for u in uploads) == len(kept)
    filtered = sum(v for (name, labels), v in metrics.items()
                   if name == "sink_records_filtered_total" and ("topic", topic) in labels)
    assert filtered == len(orders) - len(kept)
