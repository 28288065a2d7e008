"""Replays that fail at the same offset with the same error are counted; outages are not."""

from __future__ import annotations

from sink_service.driver.repeated_failures import Failure, RepeatedFailures

A = ("t", 0)


def failure(offset: int = 10, error: str = "ArrowInvalid: boom", counts: bool = True) -> Failure:
    return Failure("t", 0, offset, error, counts)


def test_the_same_failure_reaches_the_limit():
    repeated = RepeatedFailures(limit=3)
    assert repeated.observe([], [failure()]) == []
    assert repeated.observe([], [failure()]) == []
    [streak] = repeated.observe([], [failure()])
    assert streak.times == 3
    assert "topic=t partition=0 offset=10 failed 3 time(s)" in streak.describe()
    assert "ArrowInvalid: boom" in streak.describe()


def test_progress_or_another_error_starts_over():
    repeated = RepeatedFailures(limit=2)
    repeated.observe([], [failure(offset=10)])
    assert repeated.observe([], [failure(offset=11)]) == []  # moved on: a new place
    assert repeated.observe([], [failure(offset=11, error="other")]) == []
    repeated.observe([A], [])
    assert repeated.streaks == {}
    assert repeated.observe([], [failure(offset=11, error="other")]) == []


def test_outages_never_count():
    repeated = RepeatedFailures(limit=1)
    assert repeated.observe([], [failure(counts=False)] * 5) == []
    assert repeated.streaks == {}
    assert len(repeated.observe([], [failure()])) == 1
