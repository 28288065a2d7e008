"""The Delta target's maintenance and schema-evolution settings: defaults, wiring and the vacuum floor."""

from __future__ import annotations

import pytest

from sink_service.config import ConfigError, load_config
from sink_service.config.upload_targets import target_settings
from uploader.delta_settings import DeltaSettings

DELTA = {"SINK_KAFKA_BOOTSTRAP_SERVERS": "broker:9092", "SINK_TOPICS": "orders", "SINK_TARGET": "delta",
         "SINK_DELTA_TABLE_URI": "/data/lake/{topic}", "SINK_PRIMARY_KEYS": "id"}


def problems_of(environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(environ)
    return info.value.problems


def test_maintenance_defaults_keep_readers_safe_and_reach_the_target():
    settings = target_settings(load_config(DELTA))
    assert isinstance(settings, DeltaSettings)
    assert (settings.compact_every_commits, settings.vacuum_every_commits, settings.vacuum_retention_hours,
            settings.widen_to_string) == (100, 1000, 168, False)


def test_maintenance_settings_are_wired_and_zero_turns_them_off():
    settings = target_settings(load_config({
        **DELTA, "SINK_DELTA_COMPACT_EVERY_COMMITS": "0", "SINK_DELTA_VACUUM_EVERY_COMMITS": "50",
        "SINK_DELTA_VACUUM_RETENTION_HOURS": "0", "SINK_DELTA_WIDEN_TO_STRING": "true"}))
    assert (settings.compact_every_commits, settings.vacuum_every_commits, settings.vacuum_retention_hours,
            settings.widen_to_string) == (0, 50, 0, True)
    floor = target_settings(load_config({**DELTA, "SINK_DELTA_VACUUM_RETENTION_HOURS": "24"}))
    assert floor.vacuum_retention_hours == 24


@pytest.mark.parametrize("hours", ["1", "23"])
def test_a_vacuum_retention_below_the_floor_is_refused_naming_the_setting(hours):
    problems = problems_of({**DELTA, "SINK_DELTA_VACUUM_RETENTION_HOURS": hours})
    assert len(problems) == 1
    assert problems[0].startswith(f"SINK_DELTA_VACUUM_RETENTION_HOURS={hours} is below the safe floor of 24 hours")
    assert "or 0 to turn vacuum off" in problems[0]


def test_negative_maintenance_intervals_are_refused():
    problems = problems_of({**DELTA, "SINK_DELTA_COMPACT_EVERY_COMMITS": "-1"})
    assert any("SINK_DELTA_COMPACT_EVERY_COMMITS" in p for p in problems)
