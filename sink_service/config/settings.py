"""`SinkConfig`: the settings of every concern in one frozen dataclass, and the startup dump."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sink_service.config.declare import MASK
from sink_service.config.decode import DecodeSettings
from sink_service.config.flush import FlushSettings
from sink_service.config.kafka import KAFKA_PASSTHROUGH_PREFIX, KafkaSettings, is_secret_kafka_option
from sink_service.config.runtime import RuntimeSettings
from sink_service.config.target import TargetSettings
from uploader.masking import mask_userinfo


@dataclass(frozen=True)
class SinkConfig(RuntimeSettings, TargetSettings, DecodeSettings, FlushSettings, KafkaSettings):
    """The whole configuration: one frozen dataclass over the settings of every concern, whose
    fields keep the order of the README's reference (Kafka, Flush, ... Runtime)."""

    # Not declared: filled from SINK_KAFKA_<NAME> variables.
    kafka_options: Mapping[str, str] = field(default_factory=dict, metadata={"internal": True})

    # --- Derived values -----------------------------------------------------------------------
    def __post_init__(self) -> None:
        # A default that depends on another setting is resolved here, once: EMS tables are flat.
        if self.flatten is None:
            object.__setattr__(self, "flatten", self.target == "ems")

    def table_for(self, topic: str) -> str:
        return (self.ems_target_table or "{topic}").replace("{topic}", topic)

    def kafka_client_config(self) -> dict[str, str]:
        """librdkafka settings shared by every client the service makes (SINK_KAFKA_* options included)."""
        return {"bootstrap.servers": self.kafka_bootstrap_servers, **self.kafka_options}

    def selected_metadata_columns(self) -> tuple[str, ...]:
        """SINK_METADATA_COLUMNS without `none`, which selects no column."""
        return tuple(name for name in self.metadata_columns if name != "none")

    def masked(self) -> dict[str, Any]:
        """Effective configuration with secrets masked, for the startup log."""
        dump: dict[str, Any] = {}
        for f in declared_fields():
            value = getattr(self, f.name)
            dump[f.metadata["env"]] = MASK if f.metadata["secret"] and value else _unless_in_url(value)
        for name, value in sorted(self.kafka_options.items()):
            env = KAFKA_PASSTHROUGH_PREFIX + name.upper().replace(".", "_")
            dump[env] = MASK if is_secret_kafka_option(name) else _unless_in_url(value)
        return dump


def _unless_in_url(value: Any) -> Any:
    """Credentials written into any URL-shaped text (`http://user:pass@proxy:3128`) are masked."""
    return mask_userinfo(value, MASK) if isinstance(value, str) else value


def declared_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(SinkConfig) if "env" in f.metadata]


def _declared_envs() -> set[str]:
    return {f.metadata["env"] for f in declared_fields()}


def kafka_passthrough(environ: Mapping[str, str]) -> dict[str, str]:
    """`SINK_KAFKA_SASL_MECHANISM=X` becomes librdkafka `sasl.mechanism=X`."""
    declared = _declared_envs()
    return {
        env[len(KAFKA_PASSTHROUGH_PREFIX):].lower().replace("_", "."): value
        for env, value in environ.items()
        if env.startswith(KAFKA_PASSTHROUGH_PREFIX) and env not in declared
    }
