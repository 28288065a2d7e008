"""Environments for configuration tests of the row-shape stages."""

from __future__ import annotations

import pytest

from sink_service.config import ConfigError, load_config


def ems_env(**settings: str) -> dict[str, str]:
    """A valid EMS configuration, plus `settings`."""
    return {
        "SINK_KAFKA_BOOTSTRAP_SERVERS": "broker:9092", "SINK_TOPICS": "orders",
        "SINK_EMS_ENDPOINT": "https://team.realm.celonis.cloud/continuous-batch-processing/api/v1/pool/items",
        "SINK_EMS_AUTHORIZATION": "AppKey secret", "SINK_EMS_TARGET_TABLE": "{topic}", **settings,
    }


def config_problems(environ: dict[str, str]) -> list[str]:
    """The problems `load_config` reports for `environ` (it must refuse it)."""
    with pytest.raises(ConfigError) as info:
        load_config(environ)
    return info.value.problems
