"""Protobuf values and keys through the schema registry: produced with confluent-kafka's own
ProtobufSerializer against local_registry, decoded by `sink_service.decode`."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from local_registry import LocalRegistry
from sink_service.decode import RAW_SCHEMA, DecodeSpec, decode
from sink_service.decode.protobuf_values import message_indexes
from sink_service.decode.registry import RegistrySettings
from tests.support.protobuf_messages import key_class, order_class, referencing_class

V1, V2, KEY = order_class(1), order_class(2), key_class()


@pytest.fixture
def registry():
    server = LocalRegistry().start()
    yield server
    server.stop()


@pytest.fixture
def produce(registry):
    client = SchemaRegistryClient({"url": registry.url})
    serializers = {cls: ProtobufSerializer(cls, client, {"use.deprecated.format": False}) for cls in (V1, V2, KEY)}

    def produce(message, field: MessageField = MessageField.VALUE) -> bytes:
        return serializers[type(message)](message, SerializationContext("orders", field))
    return produce


def order(cls, i: int, **fields):
    message = cls(id=i, name=f"n{i}", amount=i + 0.5, status=i % 2, tags=["a"] * i, big=2**64 - i, **fields)
    message.created.FromDatetime(dt.datetime(2024, 1, 2, 3, 4, 5, 123_456))
    message.attrs["k"] = i
    message.customer.name = f"c{i}"
    return message


def spec(registry, **kwargs) -> DecodeSpec:
    return DecodeSpec(None, (), "_offset", value_format="protobuf", registry=RegistrySettings(registry.url), **kwargs)


def raw_batch(values: list[bytes], keys: list[bytes] | None = None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([
        {"topic": "orders", "partition": 1, "offset": 10 + i, "timestamp_ms": 0,
         "key": None if keys is None else keys[i], "value": value} for i, value in enumerate(values)
    ], schema=RAW_SCHEMA)


def test_scalars_enums_timestamps_maps_and_nested_messages_map_to_arrow_types(registry, produce):
    [table] = decode(raw_batch([produce(order(V1, 1, note="hi")), produce(V1(id=2))]), spec(registry)).segments
    types = dict(zip(table.schema.names, table.schema.types, strict=True))
    assert types["id"] == pa.int64() and types["amount"] == pa.float64()
    assert types["status"] == types["attrs"] == types["note"] == pa.string()
    assert types["created"] == pa.timestamp("us", tz="UTC")
    assert types["tags"] == pa.list_(pa.string())
    assert types["customer"] == pa.struct([("name", pa.string()), ("vip", pa.bool_())])
    assert types["big"] == pa.decimal128(20, 0)
    full, empty = table.to_pylist()
    assert full["status"] == "PAID" and full["attrs"] == '{"k":1}' and full["note"] == "hi"
    assert full["created"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123_456, dt.UTC)
    assert full["big"] == decimal.Decimal(2**64 - 1) and full["customer"] == {"name": "c1", "vip": False}
    # proto3: scalars without presence read as their defaults; messages and `optional` fields as null
    assert (empty["name"], empty["amount"], empty["status"], empty["tags"]) == ("", 0.0, "NEW", [])
    assert (empty["created"], empty["customer"], empty["note"]) == (None, None, None)


def test_two_schema_versions_in_one_chunk_both_decode_and_widen_the_table(registry, produce):
    values = [produce(order(V1, 1)), produce(order(V2, 2, coupon="C2")), produce(order(V1, 3))]
    [table] = decode(raw_batch(values), spec(registry)).segments
    assert table.column("coupon").to_pylist() == [None, "C2", None]
    assert table.column("id").to_pylist() == [1, 2, 3]
    assert table.column("_offset").to_pylist() == [10, 11, 12]


def test_unknown_ids_bad_indexes_and_corrupt_messages_are_bad_records(registry, produce):
    good = produce(order(V1, 1))
    values = [good, good[:1] + b"\x00\x00\x03\xe7" + good[5:], good[:5] + b"\x02\x0a", good[:6] + b"\xff\xff",
              b"plain"]
    chunk = decode(raw_batch(values), spec(registry))
    assert [row["id"] for row in chunk.segments[0].to_pylist()] == [1]
    assert {b.offset: b.kind for b in chunk.bad_records} == {
        11: "unknown_schema_id", 12: "invalid_protobuf", 13: "invalid_protobuf", 14: "invalid_protobuf"}


def test_message_indexes_follow_the_confluent_encoding():
    assert message_indexes(b"\x00rest") == ((0,), 1)  # the short form of [0]; the message starts at 1
    assert message_indexes(b"\x04\x02\x06rest") == ((1, 3), 3)  # count 2, then 1 and 3 (zigzag)
    assert message_indexes(b"head\x02\x00rest", 4) == ((0,), 6)  # the long form of [0]
    with pytest.raises(ValueError, match="ends inside"):
        message_indexes(b"\x04\x02")


def test_protobuf_keys_fields_become_columns_and_primary_keys(registry, produce):
    keys = [produce(KEY(id=7), MessageField.KEY), produce(KEY(id=8), MessageField.KEY)]
    chunk = decode(raw_batch([produce(order(V1, 1)), produce(order(V1, 2))], keys),
                   spec(registry, key_format="protobuf", key_fields_prefix="k_", primary_keys_from_key=True))
    [table] = chunk.segments
    assert table.column("k_id").to_pylist() == [7, 8]
    assert chunk.primary_keys == ("k_id",)
    assert table.column("_key").to_pylist() == keys


def test_imports_registered_as_references_and_nested_message_types_decode(registry):
    invoice = referencing_class()
    line = invoice.Line
    client = SchemaRegistryClient({"url": registry.url})
    context = SerializationContext("invoices", MessageField.VALUE)
    values = [ProtobufSerializer(invoice, client, {"use.deprecated.format": False})(
                  invoice(id=1, customer={"name": "Ann"}), context),
              ProtobufSerializer(line, client, {"use.deprecated.format": False})(line(sku="s-1"), context)]
    assert "shop/party.proto" in client.get_subjects()  # the import went in as a reference
    chunk = decode(raw_batch(values), spec(registry))
    assert not chunk.bad_records
    [table] = chunk.segments
    assert table.select(["id", "customer", "sku"]).to_pylist() == [
        {"id": 1, "customer": {"name": "Ann"}, "sku": None}, {"id": None, "customer": None, "sku": "s-1"}]
