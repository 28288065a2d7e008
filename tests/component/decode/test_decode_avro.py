"""Avro values and keys through the schema registry: produced with confluent-kafka's own serializer
against local_registry, decoded by `sink_service.decode`."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import tenacity
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from local_registry import LocalRegistry
from sink_service.config.upload_targets import build_target
from sink_service.decode import RAW_SCHEMA, DecodeSpec, decode
from sink_service.decode.registry import RegistryClient, RegistryRefused, RegistrySettings, RegistryUnavailable
from sink_service.task.outcomes import ERROR_READ
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.ranges import Range
from uploader.directory import DirectorySettings
from uploader.retry import RetryPolicy

AUTH = "sink:s3cret"
ORDER_V1 = {
    "type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "either", "type": ["null", "long", "string"], "default": None},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"}, {"name": "vip", "type": "boolean"}]}},
        {"name": "billing", "type": ["null", "Customer"], "default": None},
    ],
}
COUPON = {"name": "coupon", "type": ["null", "string"], "default": None}  # version 2 adds an optional field
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], COUPON]}
KEY = {"type": "record", "name": "OrderKey", "fields": [{"name": "id", "type": "long"}]}


def order(i: int, **extra) -> dict:
    return {
        "id": i, "amount": decimal.Decimal("12.34") * i, "at": dt.datetime(2024, 1, 2, 3, 4, 5, 678_000, dt.UTC),
        "at_us": dt.datetime(2024, 1, 2, 3, 4, 5, 678_901, dt.UTC), "day": dt.date(2024, 1, 2),
        "ref": uuid.UUID(int=i), "note": None if i % 2 else f"n{i}", "either": i if i % 2 else "text",
        "status": "PAID", "tags": ["a", "b"], "attrs": {"x": i}, "customer": {"name": "Ann", "vip": True},
        "billing": None, **extra,
    }


@pytest.fixture
def registry():
    server = LocalRegistry(basic_auth=AUTH).start()
    yield server
    server.stop()


@pytest.fixture
def produce(registry):
    client = SchemaRegistryClient({"url": registry.url, "basic.auth.user.info": AUTH})

    def produce(schema: dict, record: dict, field: MessageField = MessageField.VALUE) -> bytes:
        return AvroSerializer(client, json.dumps(schema))(record, SerializationContext("orders", field))
    return produce


def spec(registry, **kwargs) -> DecodeSpec:
    return DecodeSpec(None, kwargs.pop("primary_keys", ()), "_offset", value_format="avro",
                      registry=RegistrySettings(registry.url, AUTH), **kwargs)


def raw_batch(values: list[bytes], keys: list[bytes | None] | None = None, start: int = 100) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([
        {"topic": "orders", "partition": 3, "offset": start + i, "timestamp_ms": 0,
         "key": None if keys is None else keys[i], "value": value} for i, value in enumerate(values)
    ], schema=RAW_SCHEMA)


def test_logical_types_unions_and_nested_types_map_to_matching_arrow_types(registry, produce):
    chunk = decode(raw_batch([produce(ORDER_V1, order(i)) for i in (1, 2)]), spec(registry))
    [table] = chunk.segments
    assert not chunk.bad_records
    types = dict(zip(table.schema.names, table.schema.types, strict=True))
    assert types["id"] == pa.int64()
    assert types["amount"] == pa.decimal128(10, 2)
    assert types["at"] == pa.timestamp("ms", tz="UTC")
    assert types["at_us"] == pa.timestamp("us", tz="UTC")
    assert types["day"] == pa.date32()
    assert types["ref"] == types["note"] == types["either"] == types["status"] == types["attrs"] == pa.string()
    assert types["tags"] == pa.list_(pa.string())
    assert types["customer"] == types["billing"] == pa.struct([("name", pa.string()), ("vip", pa.bool_())])
    first, second = table.to_pylist()
    assert first["amount"] == decimal.Decimal("12.34") and second["amount"] == decimal.Decimal("24.68")
    assert first["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, 678_000, dt.UTC)
    assert first["at_us"] == dt.datetime(2024, 1, 2, 3, 4, 5, 678_901, dt.UTC)
    assert first["day"] == dt.date(2024, 1, 2)
    assert first["ref"] == str(uuid.UUID(int=1))
    assert (first["note"], second["note"]) == (None, "n2")
    assert (first["either"], second["either"]) == ("1", "text")  # a union of several types: JSON text
    assert first["attrs"] == '{"x":1}'
    assert first["customer"] == {"name": "Ann", "vip": True} and first["billing"] is None
    assert [row["_offset"] for row in table.to_pylist()] == [100, 101]


def test_two_schema_versions_in_one_chunk_both_decode_and_widen_the_table(registry, produce):
    values = [produce(ORDER_V1, order(1)), produce(ORDER_V2, order(2, coupon="C2")), produce(ORDER_V1, order(3))]
    [table] = decode(raw_batch(values), spec(registry)).segments
    assert table.column("coupon").to_pylist() == [None, "C2", None]
    assert table.column("id").to_pylist() == [1, 2, 3]
    assert table.column("_offset").to_pylist() == [100, 101, 102]


def test_unknown_schema_ids_and_undecodable_bytes_are_bad_records(registry, produce):
    good = produce(ORDER_V1, order(1))
    values = [good, b"\x00\x00\x00\x03\xe7" + good[5:], b'{"id": 1}', good[:9], good + b"\x00", b"\x00\x00"]
    chunk = decode(raw_batch(values), spec(registry))
    assert [row["id"] for row in chunk.segments[0].to_pylist()] == [1]
    bad = {b.offset: b for b in chunk.bad_records}
    assert {o: b.kind for o, b in bad.items()} == {
        101: "unknown_schema_id", 102: "invalid_avro", 103: "invalid_avro", 104: "invalid_avro", 105: "invalid_avro"}
    assert "schema id 999 is not in the schema registry" in bad[101].reason
    assert "magic byte" in bad[102].reason
    assert "1 bytes left" in bad[104].reason
    assert bad[101].describe().startswith("topic=orders partition=3 offset=101:")


def test_avro_keys_fields_become_columns_and_primary_keys(registry, produce):
    keys = [produce(KEY, {"id": i}, MessageField.KEY) for i in (7, 8)]
    values = [produce(ORDER_V1, order(1)), produce(ORDER_V1, order(2))]
    chunk = decode(raw_batch(values, keys), spec(registry, key_format="avro", key_fields_prefix="k_",
                                                 primary_keys_from_key=True))
    [table] = chunk.segments
    assert chunk.primary_keys == ("k_id",)
    assert table.column("k_id").to_pylist() == [7, 8]
    assert table.column("_key").to_pylist() == keys  # the key's bytes


def test_a_key_that_does_not_decode_is_a_bad_record(registry, produce):
    keys = [produce(KEY, {"id": 7}, MessageField.KEY), b"not avro"]
    values = [produce(ORDER_V1, order(1)), produce(ORDER_V1, order(2))]
    chunk = decode(raw_batch(values, keys), spec(registry, key_format="avro", primary_keys_from_key=True))
    assert [(b.offset, b.kind) for b in chunk.bad_records] == [(101, "invalid_avro")]
    assert chunk.bad_records[0].reason.startswith("key: not in the schema registry wire format")


@pytest.fixture
def no_backoff(monkeypatch):
    monkeypatch.setattr(RegistryClient._fetch.retry, "wait", tenacity.wait_none())


def test_a_registry_that_does_not_answer_is_an_outage_not_a_bad_record(registry, produce, tmp_path: Path,
                                                                         no_backoff):
    values = [produce(ORDER_V2, order(1, coupon=None))]  # a schema id no worker has cached yet
    registry.fail_with = 503
    with pytest.raises(RegistryUnavailable, match="answered 503"):
        decode(raw_batch(values), spec(registry))
    task = TaskSpec(decode=spec(registry), target_settings=DirectorySettings(
        path=str(tmp_path / "out"), retry=RetryPolicy(max_elapsed_s=1)), build_target=build_target,
        table_template="{topic}", scratch_dir=str(tmp_path / "scratch"), flush_bytes=1 << 30, flush_records=10,
        compression="snappy", error_policy="skip")
    outcome = process_range(task, Range("orders", 3, 100, 101), lambda _rng: iter([raw_batch(values)])).to_pylist()[0]
    assert (outcome["status"], outcome["error_kind"], outcome["bad_records"]) == ("retryable", ERROR_READ, 0)
    assert outcome["committable"] == 100
    registry.fail_with = None
    outcome = process_range(task, Range("orders", 3, 100, 101), lambda _rng: iter([raw_batch(values)])).to_pylist()[0]
    assert (outcome["status"], outcome["records_uploaded"]) == ("ok", 1)


def test_wrong_credentials_stop_the_service_without_retrying(registry, produce, tmp_path: Path):
    # Retrying a refused credential can lock the account: one request, then a fatal outcome naming the setting.
    values = [produce(ORDER_V1, order(1))]
    wrong = DecodeSpec(None, (), "_offset", value_format="avro", registry=RegistrySettings(registry.url, "sink:nope"))
    requests_before = registry.requests
    with pytest.raises(RegistryRefused, match="SINK_SCHEMA_REGISTRY_BASIC_AUTH"):
        decode(raw_batch(values), wrong)
    assert registry.requests - requests_before == 1
    task = TaskSpec(decode=wrong, target_settings=DirectorySettings(
        path=str(tmp_path / "out"), retry=RetryPolicy(max_elapsed_s=1)), build_target=build_target,
        table_template="{topic}", scratch_dir=str(tmp_path / "scratch"), flush_bytes=1 << 30, flush_records=10,
        compression="snappy", error_policy="skip")
    outcome = process_range(task, Range("orders", 3, 100, 101), lambda _rng: iter([raw_batch(values)])).to_pylist()[0]
    assert (outcome["status"], outcome["committable"], outcome["bad_records"]) == ("fatal", 100, 0)
    assert "SINK_SCHEMA_REGISTRY_BASIC_AUTH" in outcome["error"] and "nope" not in outcome["error"]


def test_a_record_that_holds_itself_is_json_text_below_the_top(registry, produce):
    tree = {"type": "record", "name": "Node", "fields": [
        {"name": "label", "type": "string"}, {"name": "children", "type": {"type": "array", "items": "Node"}}]}
    value = produce(tree, {"label": "root", "children": [{"label": "leaf", "children": []}]})
    [table] = decode(raw_batch([value]), spec(registry)).segments
    assert table.schema.field("children").type == pa.list_(pa.string())
    assert table.column("children").to_pylist() == [['{"label":"leaf","children":[]}']]


def test_each_schema_is_fetched_once_per_worker(registry, produce):
    values = [produce(ORDER_V1, order(i)) for i in range(5)]
    before = registry.requests
    for _ in range(3):
        decode(raw_batch(values), spec(registry))
    assert registry.requests - before == 1


def test_credentials_in_the_registry_url_never_reach_an_error(no_backoff):
    settings = RegistrySettings("http://sink:url-secret@127.0.0.1:9", "")  # nothing listens on port 9
    with pytest.raises(RegistryUnavailable) as info:
        decode(raw_batch([b"\x00\x00\x00\x00\x01\x02"]), DecodeSpec(None, (), "_offset", value_format="avro",
                                                                    registry=settings))
    assert "url-secret" not in str(info.value) and "127.0.0.1:9" in str(info.value)
