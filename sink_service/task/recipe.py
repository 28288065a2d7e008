"""What the driver sends its tasks: the configuration a `TaskSpec` is built from, not the spec.

The spec holds the decoders' Arrow schemas, the compiled transform and the upload target's
settings. Built in the driver, it made the driver import pyarrow, numpy, the decoders and the
targets (~50 MB of its RSS) only to pickle them, and every task unpickled them again. The recipe
is plain data; each Python worker builds the spec once per query (`datasource`) and reuses it
across tasks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sink_service.config.settings import SinkConfig
from sink_service.logs import WorkerLogging, current
from sink_service.task.upload_signals import NO_SIGNALS, SignalChannel

if TYPE_CHECKING:
    from sink_service.task.dead_letters import DeadLetterSpec
    from sink_service.task.partition_task import TaskSpec


@dataclass(frozen=True)
class TaskRecipe:
    config: SinkConfig
    client_config: Mapping[str, str]  # the Kafka client settings, also the dead-letter producer's
    signals: SignalChannel = NO_SIGNALS  # live upload signals to the driver
    # The driver's log format and secret scrubber, taken when the recipe is made there (after
    # `logs.configure`), installed in each Python worker by `process_range`.
    logging: WorkerLogging | None = field(default_factory=current)

    @classmethod
    def of(cls, config: SinkConfig, client_config: Mapping[str, str], signals: SignalChannel) -> TaskRecipe:
        # Tasks never authenticate Spark's RPC: its secret stays in the driver.
        return cls(dataclasses.replace(config, spark_auth_secret=None), dict(client_config), signals)

    def dead_letters(self) -> DeadLetterSpec | None:
        from sink_service.task.dead_letters import DeadLetterSpec

        topic = self.config.dlq_topic
        return DeadLetterSpec.of(topic, self.client_config) if topic else None

    def build(self) -> TaskSpec:
        from sink_service.config import transform_for
        from sink_service.config.decode_spec import decode_spec
        from sink_service.config.upload_targets import build_target, task_target_settings
        from sink_service.task.partition_task import TaskSpec

        c = self.config
        return TaskSpec(
            decode=decode_spec(c),
            target_settings=task_target_settings(c),
            build_target=build_target,
            table_template=c.ems_target_table or "{topic}",
            scratch_dir=c.scratch_dir,
            flush_bytes=c.flush_bytes,
            flush_records=c.flush_records,
            compression=c.parquet_compression,
            error_policy=c.error_policy,
            compact_files=c.compact_files,
            typed_table=c.target == "delta",
            signals=self.signals,
            dead_letters=self.dead_letters(),
            transform=transform_for(c),
            logging=self.logging,
        )

