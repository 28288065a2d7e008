"""The service's configuration: every setting declared once, as data, by concern (kafka, flush,
decode, target, runtime), behind one `load_config`. That one declaration drives validation (all
problems reported at once), the masked startup dump and the README's reference
(`scripts/config_reference.py` regenerates it)."""

from sink_service.config.checks import _CHECKS, transform_for
from sink_service.config.declare import MASK, ConfigError, setting
from sink_service.config.decode import REGISTRY_FORMATS, STRUCTURED_KEY_FORMATS, DecodeSettings, csv_character
from sink_service.config.flush import FlushSettings
from sink_service.config.kafka import (
    KAFKA_PASSTHROUGH_PREFIX,
    RESERVED_KAFKA_OPTIONS,
    KafkaSettings,
    is_secret_kafka_option,
)
from sink_service.config.load import NON_SETTING_NAMES, load_config
from sink_service.config.reference import README_END, README_START, reference_markdown, with_reference
from sink_service.config.runtime import RuntimeSettings
from sink_service.config.settings import SinkConfig, declared_fields, kafka_passthrough
from sink_service.config.target import S3_URL_SCHEME, TargetSettings

__all__ = [
    "KAFKA_PASSTHROUGH_PREFIX",
    "MASK",
    "NON_SETTING_NAMES",
    "README_END",
    "README_START",
    "REGISTRY_FORMATS",
    "RESERVED_KAFKA_OPTIONS",
    "S3_URL_SCHEME",
    "STRUCTURED_KEY_FORMATS",
    "_CHECKS",
    "ConfigError",
    "DecodeSettings",
    "FlushSettings",
    "KafkaSettings",
    "RuntimeSettings",
    "SinkConfig",
    "TargetSettings",
    "csv_character",
    "declared_fields",
    "is_secret_kafka_option",
    "kafka_passthrough",
    "load_config",
    "reference_markdown",
    "setting",
    "transform_for",
    "with_reference",
]
