"""SINK_STARTING_OFFSETS: `earliest`, `latest` or `timestamp:<ISO-8601 with offset>`, checked at startup."""

from __future__ import annotations

import pytest

from sink_service.config import load_config
from sink_service.shared.instants import starting_time_ms
from tests.support.config_helpers import config_problems, ems_env


@pytest.mark.parametrize("value", ["timestamp:2026-11-24T14:00:00Z", "timestamp:2026-11-24T15:00:00+01:00",
                                   "timestamp:2026-11-24T14:00:00.000+00:00"])
def test_a_time_with_its_utc_offset_is_accepted_and_names_one_instant(value):
    config = load_config(ems_env(SINK_STARTING_OFFSETS=value))
    assert starting_time_ms(config.starting_offsets) == 1_795_528_800_000


@pytest.mark.parametrize(("value", "why"), [
    ("timestamp:2026-11-24T14:00:00", "has no UTC offset"),
    ("timestamp:2026-11-24", "has no UTC offset"),
    ("timestamp:last tuesday", "is not an ISO-8601 time"),
    ("timestamp:", "is not an ISO-8601 time"),
    ("middle", "must be earliest, latest or timestamp:"),
])
def test_a_malformed_value_is_a_startup_problem_listed_with_the_others(value, why):
    problems = config_problems(ems_env(SINK_STARTING_OFFSETS=value, SINK_FLUSH_RECORDS="lots"))
    assert len(problems) == 2, problems
    [problem] = [p for p in problems if "SINK_STARTING_OFFSETS" in p]
    assert why in problem
    assert any("SINK_FLUSH_RECORDS" in p for p in problems)
