"""SINK_VALUE_FORMAT, SINK_KEY_FORMAT and the schema registry settings: every problem at once."""

from __future__ import annotations

from sink_service.config import MASK, csv_character, load_config
from tests.support.config_helpers import config_problems, ems_env


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


def test_csv_columns_header_delimiter_and_quote():
    config = load_config(ems_env(SINK_VALUE_FORMAT="csv", SINK_CSV_COLUMNS="id BIGINT, name STRING",
                                 SINK_CSV_DELIMITER="\\t", SINK_CSV_QUOTE="'"))
    assert csv_character(config.csv_delimiter, ",") == "\t"
    assert load_config(ems_env(SINK_VALUE_FORMAT="csv", SINK_CSV_HEADER="true")).csv_header


def test_csv_problems_are_listed_at_once():
    problems = config_problems(ems_env(SINK_VALUE_FORMAT="csv", SINK_CSV_DELIMITER=";;", SINK_CSV_QUOTE=";"))
    assert any(p.startswith("SINK_VALUE_FORMAT=csv needs SINK_CSV_COLUMNS") for p in problems)
    assert any(p.startswith("SINK_CSV_DELIMITER must be one character") for p in problems)
    problems = config_problems(ems_env(SINK_VALUE_FORMAT="csv", SINK_CSV_COLUMNS="id BIGINT, tags ARRAY<STRING>",
                                       SINK_CSV_DELIMITER='"'))
    assert any("declares tags as STRUCT, ARRAY or MAP" in p for p in problems)
    assert "SINK_CSV_DELIMITER and SINK_CSV_QUOTE must differ." in problems
    assert config_problems(ems_env(SINK_VALUE_FORMAT="csv", SINK_CSV_COLUMNS="id BIGINT,")) != []


def test_csv_options_without_the_csv_format_are_a_problem():
    problems = config_problems(ems_env(SINK_CSV_COLUMNS="id BIGINT", SINK_CSV_HEADER="true"))
    assert "SINK_CSV_COLUMNS, SINK_CSV_HEADER apply only to CSV values; set SINK_VALUE_FORMAT=csv or unset them." \
        in problems
