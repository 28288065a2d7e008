"""local_registry, driven by confluent-kafka's own SchemaRegistryClient (not only by itself)."""

from __future__ import annotations

import json

import pytest
import requests
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from local_registry import LocalRegistry

V1 = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})
V2 = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"},
                                                           {"name": "b", "type": ["null", "string"], "default": None}]})


@pytest.fixture
def registry():
    server = LocalRegistry(basic_auth="u:p").start()
    yield server
    server.stop()


def client(registry: LocalRegistry, auth: str = "u:p") -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry.url, "basic.auth.user.info": auth})


def test_subjects_versions_and_ids_as_the_client_reads_them(registry):
    c = client(registry)
    first = c.register_schema("orders-value", Schema(V1, "AVRO"))
    second = c.register_schema("orders-value", Schema(V2, "AVRO"))
    again = client(registry).register_schema("orders-value", Schema(V1, "AVRO"))  # no cache: asks the server
    other = c.register_schema("payments-value", Schema(V1, "AVRO"))
    assert (first, second, again, other) == (1, 2, 1, 1)  # one id per schema text, across subjects
    fresh = client(registry)
    assert fresh.get_schema(2).schema_str == V2
    assert sorted(fresh.get_subjects()) == ["orders-value", "payments-value"]
    assert fresh.get_versions("orders-value") == [1, 2]
    latest = fresh.get_latest_version("orders-value")
    assert (latest.schema_id, latest.version, latest.schema.schema_str) == (2, 2, V2)
    assert fresh.get_version("orders-value", 1).schema_id == 1
    assert fresh.lookup_schema("orders-value", Schema(V2, "AVRO")).version == 2


def test_unknown_ids_and_subjects_have_confluent_error_codes(registry):
    c = client(registry)
    with pytest.raises(SchemaRegistryError) as info:
        c.get_schema(42)
    assert (info.value.http_status_code, info.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as info:
        c.get_latest_version("nope")
    assert info.value.error_code == 40401


def test_basic_auth_is_required_when_set(registry):
    with pytest.raises(SchemaRegistryError) as info:
        client(registry, "u:wrong").get_subjects()
    assert info.value.http_status_code == 401


def test_the_fault_switch_answers_every_request_with_its_status(registry):
    requests.put(f"{registry.url}/_control/fault", json={"status": 503}, timeout=5).raise_for_status()
    assert requests.get(f"{registry.url}/subjects", auth=("u", "p"), timeout=5).status_code == 503
    requests.put(f"{registry.url}/_control/fault", json={"status": None}, timeout=5).raise_for_status()
    assert requests.get(f"{registry.url}/subjects", auth=("u", "p"), timeout=5).json() == []
