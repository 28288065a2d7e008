"""Value formats end to end: records produced with confluent-kafka's own serializers against
local_registry, the service decoding them by schema id, and local_ems's table compared with
what was produced."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devkit.kafka_data import create_topics
from devkit.service_process import REPO, wait_until
from local_registry import LocalRegistry
from tests.e2e.checks import all_committed
from tests.support.protobuf_messages import order_class

pytestmark = pytest.mark.e2e

COMMIT_BOUND_S = 60
AUTH = "sink:registry-pass-0815"
ORDER_V1 = {
    "type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"}, {"name": "vip", "type": "boolean"}]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "coupon", "type": ["null", "string"],
                                                         "default": None}]}
ORDER_KEY = {"type": "record", "name": "OrderKey", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}


@pytest.fixture(scope="module")
def registry():
    server = LocalRegistry(basic_auth=AUTH).start()
    yield server
    server.stop()


def _order(i: int, version: int) -> dict:
    record = {"id": i, "amount": decimal.Decimal(i) + decimal.Decimal("0.25"),
              "at": dt.datetime(2024, 5, 1, 12, 0, 0, i * 1000, dt.UTC), "day": dt.date(2024, 5, 1 + i % 28),
              "note": None if i % 3 else f"note {i}", "customer": {"name": f"c{i}", "vip": i % 2 == 0},
              "tags": [f"t{i}"] * (i % 3)}
    return record | ({"coupon": f"C{i}" if i % 2 else None} if version == 2 else {})


def _produce_avro(bootstrap: str, registry: LocalRegistry, topic: str, orders: list[tuple[int, int]]) -> None:
    """(id, schema version) per record, keys {"id"} in Avro too, into partition 0 in order."""
    client = SchemaRegistryClient({"url": registry.url, "basic.auth.user.info": AUTH})
    values = {1: AvroSerializer(client, json.dumps(ORDER_V1)), 2: AvroSerializer(client, json.dumps(ORDER_V2))}
    keys = AvroSerializer(client, json.dumps(ORDER_KEY))
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i, version in orders:
        producer.produce(topic, partition=0, key=keys({"id": i}, SerializationContext(topic, MessageField.KEY)),
                         value=values[version](_order(i, version), SerializationContext(topic, MessageField.VALUE)))
    producer.flush(30)


def _expected_row(offset: int, i: int, version: int) -> dict:
    """The row local_ems holds: decimals as their digits, timestamps as ISO text in milliseconds."""
    order = _order(i, version)
    return {"_offset": offset, "key_id": i, "id": i, "amount": str(order["amount"]),
            "at": order["at"].isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "day": order["day"].isoformat(), "note": order["note"], "customer_name": f"c{i}",
            "customer_vip": i % 2 == 0, "tags": json.dumps(order["tags"], separators=(",", ":")),
            "coupon": order.get("coupon")}


def test_avro_values_and_keys_through_a_schema_change_and_a_registry_outage(
        bootstrap, ems, registry, unique, service_env, services):
    """Version 1, then version 2 with an added optional field, then version 1 again; Avro keys are the
    primary keys. The registry answers 503 at first: the service is not ready and commits nothing, and
    once the registry is back every record arrives exactly as produced."""
    topic, group = unique("avro"), unique("group")
    create_topics(bootstrap, {topic: 1})
    orders = [(i, 1) for i in range(30)] + [(i, 2) for i in range(30, 60)] + [(i, 1) for i in range(60, 70)]
    _produce_avro(bootstrap, registry, topic, orders)
    registry.fail_with = 503
    env = service_env(topic, group, SINK_VALUE_FORMAT="avro", SINK_KEY_FORMAT="avro", SINK_PRIMARY_KEYS="",
                      SINK_KEY_FIELDS_PREFIX="key_", SINK_SCHEMA_REGISTRY_URL=registry.url,
                      SINK_SCHEMA_REGISTRY_BASIC_AUTH=AUTH, SINK_FLUSH_RECORDS=25, SINK_METADATA_COLUMNS="none")
    service = services(env)
    port = int(env["SINK_HTTP_PORT"])

    def not_ready_for_the_registry() -> bool:
        answer = service.readiness(port)
        return answer is not None and answer[0] == 503 and "schema registry" in answer[1]["reason"]
    wait_until(not_ready_for_the_registry, COMMIT_BOUND_S, "readiness false, naming the registry", process=service)
    assert not ems.uploads(topic) and not all_committed(bootstrap, group, topic, 1)
    registry.fail_with = None
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), COMMIT_BOUND_S, "all offsets committed",
               process=service)
    wait_until(lambda: service.readiness(port)[0] == 200, 20, "ready again", process=service)
    assert service.terminate() == 0

    rows = sorted(ems.table(topic), key=lambda row: row["key_id"])
    assert rows == [_expected_row(offset, i, version) for offset, (i, version) in enumerate(orders)]
    assert {upload["params"]["primaryKeys"] for upload in ems.uploads(topic)} == {"key_id"}
    schema = pq.read_schema(ems.uploads(topic)[0]["path"])
    assert str(schema.field("amount").type) == "decimal128(10, 2)"
    assert str(schema.field("at").type) == "timestamp[ms, tz=UTC]"
    assert str(schema.field("day").type) == "date32[day]"
    log = service.output()
    assert AUTH.split(":")[1] not in log
    assert "bad record" not in log


def _protobuf_order(cls: type, i: int):
    message = cls(id=i, name=f"n{i}", amount=i / 4, status=i % 2, tags=[f"t{i}"] * (i % 3), big=2**64 - 1 - i)
    if i % 5:
        message.created.FromDatetime(dt.datetime(2024, 5, 1, 12, 0, 0, i))
        message.customer.name, message.customer.vip = f"c{i}", i % 2 == 0
    if i % 3 == 0:
        message.note = f"note {i}"
    message.attrs["n"] = i
    if hasattr(message, "coupon") and i % 2:
        message.coupon = f"C{i}"
    return message


def _expected_protobuf_row(offset: int, i: int, version: int) -> dict:
    return {"_offset": offset, "id": i, "name": f"n{i}", "amount": i / 4, "status": "PAID" if i % 2 else "NEW",
            "created": f"2024-05-01T12:00:00.{i:06d}Z" if i % 5 else None,
            "customer_name": f"c{i}" if i % 5 else None, "customer_vip": (i % 2 == 0) if i % 5 else None,
            "tags": json.dumps([f"t{i}"] * (i % 3), separators=(",", ":")), "attrs": f'{{"n":{i}}}',
            "note": f"note {i}" if i % 3 == 0 else None, "big": str(2**64 - 1 - i),
            "coupon": f"C{i}" if version == 2 and i % 2 else None}


def test_protobuf_values_through_a_schema_change(bootstrap, ems, registry, unique, service_env, services):
    """Version 1, then version 2 (an added optional field), then 1 again, with confluent-kafka's
    ProtobufSerializer: the table holds every record exactly as produced."""
    topic, group = unique("protobuf"), unique("group")
    create_topics(bootstrap, {topic: 1})
    client = SchemaRegistryClient({"url": registry.url, "basic.auth.user.info": AUTH})
    classes = {version: order_class(version) for version in (1, 2)}
    serializers = {version: ProtobufSerializer(cls, client, {"use.deprecated.format": False})
                   for version, cls in classes.items()}
    orders = [(i, 1) for i in range(25)] + [(i, 2) for i in range(25, 50)] + [(i, 1) for i in range(50, 60)]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i, version in orders:
        context = SerializationContext(topic, MessageField.VALUE)
        value = serializers[version](_protobuf_order(classes[version], i), context)
        producer.produce(topic, partition=0, key=str(i).encode(), value=value)
    producer.flush(30)
    env = service_env(topic, group, SINK_VALUE_FORMAT="protobuf", SINK_SCHEMA_REGISTRY_URL=registry.url,
                      SINK_SCHEMA_REGISTRY_BASIC_AUTH=AUTH, SINK_FLUSH_RECORDS=20, SINK_METADATA_COLUMNS="none")
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), COMMIT_BOUND_S, "all offsets committed",
               process=service)
    assert service.terminate() == 0

    rows = sorted(ems.table(topic), key=lambda row: row["id"])
    assert rows == [_expected_protobuf_row(offset, i, version) for offset, (i, version) in enumerate(orders)]
    schema = pq.read_schema(ems.uploads(topic)[0]["path"])
    assert str(schema.field("created").type) == "timestamp[us, tz=UTC]"
    assert str(schema.field("big").type) == "decimal128(20, 0)"


def test_the_demo_with_avro_runs_to_convergence():
    """`./scripts/demo.sh --format avro`: orders produced as Avro through a local registry."""
    result = subprocess.run([sys.executable, "-m", "devkit.demo", "--keys", "300", "--updates", "3", "--format",
                             "avro"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "local schema registry at http://127.0.0.1:" in result.stdout
    assert "produced 900 Avro order events" in result.stdout
    assert "table `orders` holds 300 rows" in result.stdout


def test_csv_values_with_a_tab_delimiter_and_a_bad_row(bootstrap, ems, unique, service_env, services):
    topic, group = unique("csv"), unique("group")
    create_topics(bootstrap, {topic: 1})
    values = [b"1\tAnn\t1.50", b'2\t"B\tquoted\nline"\t2', b"3\tbad", b"4\tDan\t"]
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, partition=0, value=value)
    producer.flush(30)
    env = service_env(topic, group, SINK_VALUE_FORMAT="csv", SINK_CSV_COLUMNS="id BIGINT, name STRING, amount DOUBLE",
                      SINK_CSV_DELIMITER="\\t", SINK_ERROR_POLICY="skip", SINK_METADATA_COLUMNS="none")
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), COMMIT_BOUND_S, "all offsets committed",
               process=service)
    assert service.terminate() == 0
    assert sorted(ems.table(topic), key=lambda row: row["id"]) == [
        {"_offset": 0, "id": 1, "name": "Ann", "amount": 1.5},
        {"_offset": 1, "id": 2, "name": "B\tquoted\nline", "amount": 2.0},
        {"_offset": 3, "id": 4, "name": "Dan", "amount": None},
    ]
    assert "offset=2: invalid CSV: Expected 3 columns, got 2" in service.output()


def test_raw_values_are_written_as_they_came(bootstrap, ems, unique, service_env, services):
    topic, group = unique("raw"), unique("group")
    create_topics(bootstrap, {topic: 1})
    values = [b"\x00\x01binary\xff", b"plain text", b'{"not": "parsed"}']
    producer = Producer({"bootstrap.servers": bootstrap})
    for n, value in enumerate(values):
        producer.produce(topic, partition=0, key=f"k{n}".encode(), value=value)
    producer.flush(30)
    env = service_env(topic, group, SINK_VALUE_FORMAT="raw", SINK_PRIMARY_KEYS="_key",
                      SINK_METADATA_COLUMNS="_key")
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 1), COMMIT_BOUND_S, "all offsets committed",
               process=service)
    assert service.terminate() == 0
    rows = sorted(ems.table(topic), key=lambda row: row["_key"])
    assert [(row["_key"], row["value"]) for row in rows] == [(f"k{n}", value) for n, value in enumerate(values)]
