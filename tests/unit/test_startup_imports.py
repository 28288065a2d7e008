"""What the service imports before it launches the JVM: the rest loads while the JVM starts."""

from __future__ import annotations

import subprocess
import sys

ENV = {"SINK_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "SINK_TOPICS": "orders", "SINK_GROUP_ID": "sink",
       "SINK_TARGET": "ems", "SINK_EMS_ENDPOINT": "https://team.realm.celonis.cloud/continuous-batch-processing/api/v1/p/items",
       "SINK_EMS_AUTHORIZATION": "AppKey secret", "SINK_EMS_TARGET_TABLE": "orders", "SINK_PRIMARY_KEYS": "id"}


def test_config_checks_and_the_service_module_leave_the_pipeline_to_load_while_the_jvm_starts():
    # The JVM takes seconds on one core; the pipeline's imports (decoding, Parquet, upload, sqlglot:
    # ~0.5 s) run on the other meanwhile, so they must not be on the way to its launch.
    # Nor pyarrow (with numpy ~50 ms), requests (~30 ms) or PySpark's data source classes (~20 ms):
    # the version line reads pyarrow's from its metadata, and only executors post upload signals.
    probe = ("import sys; from sink_service.config import load_config; "
             f"load_config({ENV!r}); import sink_service.driver.service, sink_service.cli.run as main; "
             "main._versions(); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlglot', 'duckdb', 'boto3', "
             "'pyarrow', 'numpy', 'requests') or m == 'pyspark.sql.datasource' "
             "or m.startswith(('sink_service.decode', 'sink_service.driver.pipeline', "
             "'sink_service.task.partition_task', "
             "'sink_service.kafka_source.datasource', 'uploader.ems'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_the_driver_of_a_target_other_than_delta_never_loads_pyarrow():
    # Its tasks get the configuration (task/recipe.py) and build their decoders and target themselves;
    # the planner hints need the type lattice only when ranges widened a topic differently. pyarrow
    # and numpy were ~50 MB of the driver's ~115 MB.
    probe = ("import sys; from sink_service.config import load_config; "
             f"c = load_config({ENV!r}); "
             "import sink_service.driver.service, sink_service.driver.pipeline; "
             "from sink_service.kafka_source.datasource import SourceOptions; "
             "from sink_service.kafka_source.planner_hints import PlannerHints; "
             "from sink_service.task.recipe import TaskRecipe; "
             "from sink_service.task.upload_signals import NO_SIGNALS; "
             "SourceOptions.pack_task(TaskRecipe.of(c, {'bootstrap.servers': 'b:9092'}, NO_SIGNALS)); "
             "h = PlannerHints(); [h.learn_types('orders', t) for t in ('QUJD', '', 'QUJD', '')]; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'numpy', 'sqlglot', 'duckdb') "
             "or m.startswith(('sink_service.decode', 'sink_service.task.partition_task', "
             "'sink_service.task.dead_letters', 'uploader.column_types'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
