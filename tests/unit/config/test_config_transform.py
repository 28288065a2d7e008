"""SINK_TRANSFORM_SQL at startup: every problem listed at once, with the engine's message; exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

from sink_service.config import load_config, transform_for
from tests.support.config_helpers import config_problems, ems_env

SCHEMA = "id STRING, amount STRING, status STRING, customer STRUCT<name: STRING>"


def test_a_dropped_primary_key_and_order_column_are_listed_with_other_problems():
    found = config_problems(ems_env(SINK_TRANSFORM_SQL="SELECT status FROM records", SINK_PRIMARY_KEYS="id",
                                    SINK_ORDER_FIELD="_timestamp", SINK_FLUSH_RECORDS="0"))
    assert any(p.startswith("SINK_FLUSH_RECORDS=0") for p in found), found
    assert any("SINK_TRANSFORM_SQL drops `id` (SINK_PRIMARY_KEYS)" in p for p in found), found
    assert any("SINK_TRANSFORM_SQL drops `_timestamp` (SINK_ORDER_FIELD)" in p for p in found), found


def test_invalid_sql_is_a_startup_error_with_the_parsers_message():
    [problem] = config_problems(ems_env(SINK_TRANSFORM_SQL="SELECT id, FROM records WHERE"))
    assert problem.startswith("SINK_TRANSFORM_SQL is not valid Spark SQL: ")


def test_the_statement_runs_over_the_declared_schema_at_startup():
    [problem] = config_problems(ems_env(SINK_VALUE_SCHEMA=SCHEMA, SINK_PRIMARY_KEYS="id",
                                        SINK_TRANSFORM_SQL="SELECT id, CAST(amont AS INT) AS amount FROM records"))
    assert problem.startswith('SINK_TRANSFORM_SQL does not run: Binder Error: Referenced column "amont" not found')


def test_keys_name_the_output_so_a_renamed_key_is_accepted_with_a_declared_schema():
    """Without a transform a key the schema does not declare is an error; with one, the key names
    the statement's output, here a flattened struct field renamed."""
    config = load_config(ems_env(SINK_VALUE_SCHEMA=SCHEMA, SINK_PRIMARY_KEYS="order_id",
                                 SINK_TRANSFORM_SQL="SELECT id AS order_id, customer_name FROM records"))
    transform = transform_for(config)
    assert transform is not None and transform.statement.endswith("records._offset FROM records")
    assert any("does not declare" in p for p in config_problems(
        ems_env(SINK_VALUE_SCHEMA=SCHEMA, SINK_PRIMARY_KEYS="order_id")))


def test_struct_fields_are_flattened_columns_with_sink_flatten():
    [problem] = config_problems(ems_env(SINK_TRANSFORM_SQL="SELECT id, customer.name AS customer FROM records",
                                        SINK_PRIMARY_KEYS="id"))
    assert problem == ("SINK_TRANSFORM_SQL reads `customer.name`, but SINK_FLATTEN makes rows flat: the field is "
                       "the column `customer_name`.")
    assert transform_for(load_config(ems_env(SINK_TRANSFORM_SQL="SELECT id, customer.name AS c FROM records",
                                             SINK_PRIMARY_KEYS="id", SINK_FLATTEN="false"))) is not None


def test_no_transform_is_none():
    assert transform_for(load_config(ems_env())) is None


def test_an_invalid_statement_makes_the_service_exit_2_with_the_message():
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SINK_")}
    settings = ems_env(SINK_TRANSFORM_SQL="SELECT id, count(*) AS n FROM records GROUP BY id", SINK_PRIMARY_KEYS="id")
    result = subprocess.run([sys.executable, "-m", "sink_service"], env={**environ, **settings},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "SINK_TRANSFORM_SQL uses an aggregate function" in result.stderr
    assert "SINK_TRANSFORM_SQL uses GROUP BY" in result.stderr
