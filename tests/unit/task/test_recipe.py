"""The driver sends its tasks a recipe; each Python worker builds the task spec from it once."""

from __future__ import annotations

import base64
import pickle

from sink_service.config import load_config
from sink_service.config.decode_spec import decode_spec
from sink_service.config.upload_targets import task_target_settings
from sink_service.kafka_source.datasource import SourceOptions
from sink_service.task.recipe import TaskRecipe
from sink_service.task.upload_signals import NO_SIGNALS
from tests.unit.test_startup_imports import ENV

CLIENT = {"bootstrap.servers": "127.0.0.1:9092", "sasl.password": "kafka-secret"}


def _options(task: str) -> SourceOptions:
    return SourceOptions(client_config=CLIENT, group_id="sink", starting_positions={}, flush_records=10,
                         flush_bytes=1 << 20, flush_interval_ms=1000, max_files_per_batch=8,
                         max_batch_records=800_000, executor_cores=1,
                         retention_gap_policy="fail", read_batch_max_bytes=1 << 20, state_dir="/tmp", task=task)


def test_the_spec_built_from_the_recipe_is_the_configurations():
    config = load_config({**ENV, "SINK_DLQ_TOPIC": "orders-dlq", "SINK_ERROR_POLICY": "dlq",
                          "SINK_VALUE_SCHEMA": "id STRING, total DOUBLE", "SINK_SCRATCH_DIR": "/tmp/sink-x",
                          "SINK_COMPACT_FILES": "true"})
    recipe = pickle.loads(pickle.dumps(TaskRecipe.of(config, CLIENT, NO_SIGNALS)))
    spec = recipe.build()
    assert spec.decode == decode_spec(config)
    assert spec.target_settings == task_target_settings(config)
    assert spec.table_for("orders") == "orders"
    assert (spec.scratch_dir, spec.flush_records, spec.error_policy, spec.compact_files, spec.typed_table) == (
        config.scratch_dir, config.flush_records, "dlq", True, False)
    assert spec.dead_letters is not None and spec.dead_letters.topic == "orders-dlq"
    assert dict(spec.dead_letters.client_config) == CLIENT


def test_tasks_never_receive_the_spark_rpc_secret():
    config = load_config({**ENV, "SINK_SPARK_MASTER": "spark://master:7077", "SINK_SPARK_AUTH_SECRET": "rpc-secret"})
    packed = SourceOptions.pack_task(TaskRecipe.of(config, CLIENT, NO_SIGNALS))
    assert b"rpc-secret" not in base64.b64decode(packed)
    assert config.spark_auth_secret == "rpc-secret"  # the driver's own configuration keeps it


def test_a_worker_builds_one_spec_per_query_and_reuses_it_across_tasks():
    config = load_config(ENV)
    packed = SourceOptions.pack_task(TaskRecipe.of(config, CLIENT, NO_SIGNALS))
    first = _options(packed).task_spec()
    assert _options(str(packed)).task_spec() is first  # another task of the same query
    other = load_config({**ENV, "SINK_FLUSH_RECORDS": "7"})
    assert _options(SourceOptions.pack_task(TaskRecipe.of(other, CLIENT, NO_SIGNALS))).task_spec().flush_records == 7
