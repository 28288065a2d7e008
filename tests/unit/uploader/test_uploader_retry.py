"""call_with_retries and the backoff arithmetic, without any network."""

from __future__ import annotations

import logging
import random
import time

import pytest

from uploader.errors import FatalUploadError, RetriesExhaustedError, RetryableUploadError
from uploader.retry import RetryPolicy, backoff_wait, call_with_retries

TINY = RetryPolicy(max_elapsed_s=2.0, initial_backoff_s=0.01, max_backoff_s=0.02)


class Script:
    """fn for call_with_retries: raises the scripted errors in order, then returns "ok"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[tuple[int, float]] = []

    def __call__(self, attempt: int) -> str:
        self.calls.append((attempt, time.monotonic()))
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def transient(reason: str = "http_503", retry_after_s: float | None = None) -> RetryableUploadError:
    return RetryableUploadError(f"boom {reason}", status=503, reason=reason, retry_after_s=retry_after_s)


def test_first_try_success():
    fn = Script()
    assert call_with_retries(fn, TINY) == ("ok", 1)
    assert [a for a, _ in fn.calls] == [1]


def test_retries_transient_errors_and_counts_attempts():
    fn = Script(transient(), transient("timeout"))
    seen = []
    result = call_with_retries(fn, TINY, on_retry=lambda e, n, w: seen.append((e.reason, n, w)))
    assert result == ("ok", 3)
    assert [a for a, _ in fn.calls] == [1, 2, 3]
    assert [(r, n) for r, n, _ in seen] == [("http_503", 1), ("timeout", 2)]
    assert all(0 <= w <= TINY.max_backoff_s for _, _, w in seen)


def test_fatal_error_propagates_after_one_call():
    fn = Script(FatalUploadError("bad key", status=401, reason="http_401", setting="SINK_EMS_AUTHORIZATION"))
    with pytest.raises(FatalUploadError):
        call_with_retries(fn, TINY)
    assert len(fn.calls) == 1


def test_unexpected_exceptions_are_not_retried():
    fn = Script(OSError("disk gone"))
    with pytest.raises(OSError, match="disk gone"):
        call_with_retries(fn, TINY)
    assert len(fn.calls) == 1


def test_budget_exhaustion_names_last_error_and_attempts():
    policy = RetryPolicy(max_elapsed_s=0.2, initial_backoff_s=0.01, max_backoff_s=0.02)

    def always(attempt: int) -> str:
        raise transient(f"http_50{attempt % 3}")

    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError) as caught:
        call_with_retries(always, policy)
    elapsed = time.monotonic() - started
    error = caught.value
    assert 0.2 <= elapsed < 1.5  # generous: the machine is shared
    assert error.attempts >= 3
    assert isinstance(error.__cause__, RetryableUploadError)
    assert error.last_error is error.__cause__
    assert error.reason == error.last_error.reason
    assert error.retryable
    assert f"after {error.attempts} attempt(s)" in str(error)
    assert str(error.last_error) in str(error)


def test_max_attempts_limits_calls():
    policy = RetryPolicy(max_elapsed_s=10, initial_backoff_s=0.001, max_attempts=3)
    fn = Script(*(transient() for _ in range(10)))
    with pytest.raises(RetriesExhaustedError, match="limit of 3 attempts") as caught:
        call_with_retries(fn, policy)
    assert len(fn.calls) == 3 == caught.value.attempts


def test_single_attempt_policy_does_not_retry():
    fn = Script(transient())
    with pytest.raises(RetriesExhaustedError):
        call_with_retries(fn, RetryPolicy(max_attempts=1))
    assert len(fn.calls) == 1


def test_retry_after_is_a_floor_for_the_wait():
    fn = Script(transient(retry_after_s=0.3))
    waits = []
    assert call_with_retries(fn, TINY, on_retry=lambda e, n, w: waits.append(w)) == ("ok", 2)
    assert waits == [0.3]
    assert fn.calls[1][1] - fn.calls[0][1] >= 0.3


def test_retry_after_beyond_budget_stops_without_waiting():
    fn = Script(transient(retry_after_s=30))
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError, match="server asked to wait 30s") as caught:
        call_with_retries(fn, TINY)
    assert time.monotonic() - started < 1.0  # far below the 30 s asked for
    assert len(fn.calls) == 1
    assert caught.value.retry_after_s == 30


def test_waits_never_run_past_the_budget():
    policy = RetryPolicy(max_elapsed_s=0.3, initial_backoff_s=0.2, max_backoff_s=5)
    waits = []

    def always(attempt: int) -> str:
        raise transient()

    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError):
        call_with_retries(always, policy, on_retry=lambda e, n, w: waits.append(w))
    assert time.monotonic() - started < 1.5
    assert sum(waits) <= 0.3


def test_each_retry_is_logged_at_warning(caplog):
    fn = Script(transient("http_429"))
    with caplog.at_level(logging.WARNING, logger="uploader"):
        call_with_retries(fn, TINY)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.name.startswith("uploader")
    assert "http_429" in record.getMessage() and "retrying in" in record.getMessage()


# --- backoff arithmetic -------------------------------------------------------------------------------


def test_backoff_grows_exponentially_with_full_jitter():
    policy = RetryPolicy(initial_backoff_s=1, max_backoff_s=8)
    rng = random.Random(7)
    for attempt, ceiling in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 8), (40, 8)]:
        waits = [backoff_wait(policy, attempt, None, 100, rng) for _ in range(300)]
        assert min(waits) >= 0 and max(waits) <= ceiling
        assert max(waits) > ceiling * 0.8  # really spread over the whole range
        assert min(waits) < ceiling * 0.2


def test_backoff_with_huge_attempt_number_does_not_overflow():
    assert 0 <= backoff_wait(RetryPolicy(), 10_000, None, 100) <= RetryPolicy().max_backoff_s


def test_retry_after_wins_over_a_shorter_backoff_and_budget_caps_everything():
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.1)
    assert backoff_wait(policy, 1, 5.0, 100) == 5.0
    assert backoff_wait(policy, 1, 5.0, 2.0) == 2.0
    assert backoff_wait(RetryPolicy(initial_backoff_s=50, max_backoff_s=50), 3, None, 0.5) <= 0.5
    assert backoff_wait(policy, 1, None, -1) == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [{"max_elapsed_s": -1}, {"initial_backoff_s": -0.1}, {"max_backoff_s": -1}, {"max_attempts": 0}],
)
def test_policy_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_policy_is_hashable_for_spark():
    assert hash(RetryPolicy()) == hash(RetryPolicy())
