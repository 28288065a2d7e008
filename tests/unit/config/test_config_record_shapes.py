"""Startup validation of the record-shape settings: keys, tombstones, metadata columns."""

from __future__ import annotations

import pytest

from sink_service.config import ConfigError, load_config
from tests.unit.config.test_config import env


def problems(**overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(env(**overrides))
    return info.value.problems


def test_defaults_are_todays_behaviour_except_tombstones_are_skipped():
    config = load_config(env())
    assert (config.key_format, config.key_fields_prefix, config.tombstones) == ("string", "", "skip")
    assert config.selected_metadata_columns() == ("_key", "_topic", "_partition", "_offset", "_timestamp")


def test_metadata_columns_none_and_a_selection():
    assert load_config(env(SINK_METADATA_COLUMNS="none")).selected_metadata_columns() == ()
    config = load_config(env(SINK_METADATA_COLUMNS="_headers, _offset"))
    assert config.selected_metadata_columns() == ("_headers", "_offset")


def test_every_record_shape_problem_is_listed_at_once():
    found = problems(SINK_METADATA_COLUMNS="_key,_offsett,none", SINK_KEY_FIELDS_PREFIX="k_",
                     SINK_TOMBSTONES="soft-delete", SINK_ORDER_FIELD="version", SINK_PRIMARY_KEYS="")
    assert any("`_offsett`" in p and "_headers" in p for p in found)
    assert any("`none` beside columns" in p for p in found)
    assert any(p.startswith("SINK_KEY_FIELDS_PREFIX") for p in found)
    assert any("needs primary keys" in p for p in found)
    assert any("SINK_ORDER_FIELD=`version`" in p for p in found)
    assert len(found) == 5


@pytest.mark.parametrize("overrides", [
    {"SINK_TOMBSTONES": "soft-delete", "SINK_KEY_FORMAT": "json"},
    {"SINK_TOMBSTONES": "soft-delete", "SINK_KEY_FORMAT": "json", "SINK_PRIMARY_KEYS": "key_id",
     "SINK_KEY_FIELDS_PREFIX": "key_", "SINK_ORDER_FIELD": "_timestamp"},
    {"SINK_TOMBSTONES": "soft-delete", "SINK_PRIMARY_KEYS": "_key"},
])
def test_soft_delete_with_keys_a_tombstone_carries(overrides):
    load_config(env(**overrides))


def test_soft_delete_rejects_value_fields_as_primary_keys_of_string_keys():
    [problem] = problems(SINK_TOMBSTONES="soft-delete", SINK_PRIMARY_KEYS="id")
    assert "`_key` or fields of a JSON key" in problem


def test_json_key_fields_may_be_primary_keys_beside_a_declared_value_schema():
    load_config(env(SINK_KEY_FORMAT="json", SINK_VALUE_SCHEMA="amount DOUBLE", SINK_PRIMARY_KEYS="id"))
    assert any("does not declare" in p for p in problems(SINK_VALUE_SCHEMA="amount DOUBLE", SINK_PRIMARY_KEYS="id"))


def test_unknown_key_format_and_tombstone_policy_name_their_choices():
    found = problems(SINK_KEY_FORMAT="xml", SINK_TOMBSTONES="delete")
    assert any("SINK_KEY_FORMAT" in p and "string, json, raw, avro, protobuf" in p for p in found)
    assert any("SINK_TOMBSTONES" in p and "fail, skip, soft-delete" in p for p in found)
