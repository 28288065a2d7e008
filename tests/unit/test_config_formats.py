"""SINK_VALUE_FORMAT, SINK_KEY_FORMAT and the schema registry settings: every problem at once."""

from __future__ import annotations

from sink_service.config import MASK, load_config
from tests.unit.config_helpers import config_problems, ems_env


def test_avro_values_and_keys_read_from_the_registry():
    config = load_config(ems_env(SINK_VALUE_FORMAT="avro", SINK_KEY_FORMAT="avro",
                                 SINK_SCHEMA_REGISTRY_URL="http://registry:8081",
                                 SINK_SCHEMA_REGISTRY_BASIC_AUTH="sink:hunter2"))
    assert (config.value_format, config.key_format) == ("avro", "avro")
    assert config.masked()["SINK_SCHEMA_REGISTRY_BASIC_AUTH"] == MASK
    assert "hunter2" not in repr(config.masked())


def test_the_default_is_json_without_a_registry():
    config = load_config(ems_env())
    assert (config.value_format, config.schema_registry_url) == ("json", None)


def test_every_format_problem_is_listed_at_once():
    problems = config_problems(ems_env(SINK_VALUE_FORMAT="avro", SINK_KEY_FORMAT="avro",
                                       SINK_VALUE_SCHEMA="id STRING"))
    assert "SINK_SCHEMA_REGISTRY_URL is required with SINK_KEY_FORMAT=avro and SINK_VALUE_FORMAT=avro." in problems
    assert any(p.startswith("SINK_VALUE_SCHEMA declares a JSON value's fields") for p in problems)


def test_registry_settings_are_checked_without_showing_the_secret():
    problems = config_problems(ems_env(SINK_VALUE_FORMAT="avro", SINK_SCHEMA_REGISTRY_URL="registry:8081",
                                       SINK_SCHEMA_REGISTRY_BASIC_AUTH="no-colon-secret"))
    assert any(p.startswith("SINK_SCHEMA_REGISTRY_URL must be an http(s):// URL") for p in problems)
    assert "SINK_SCHEMA_REGISTRY_BASIC_AUTH must be `user:password` (value not shown)." in problems
    assert not any("no-colon-secret" in p for p in problems)


def test_a_registry_no_format_reads_from_is_a_problem():
    problems = config_problems(ems_env(SINK_SCHEMA_REGISTRY_URL="http://registry:8081"))
    assert any("no format reads from a registry" in p for p in problems)


def test_avro_keys_give_primary_keys_and_a_prefix_like_json_keys():
    config = load_config(ems_env(SINK_KEY_FORMAT="avro", SINK_KEY_FIELDS_PREFIX="k_",
                                 SINK_SCHEMA_REGISTRY_URL="http://registry:8081"))
    assert config.key_fields_prefix == "k_"
